"""Bounded, versioned spool of harvested drafter-training samples.

A sample is one rollout's capture (token axis first: `input_ids` [T], `aux_hidden` [T, 3H], soft labels [T, k], ...)
and the policy version that produced it, each its own atomically written safetensors shard, so eviction and
`--resume` work per sample. Memory and disk each keep the newest within their limits. Training weighs a sample by
`version_decay ** (newest - its version)`.

Held out (for scoring, never trained on) by prompt, with all its samples: one in `holdout_every` (by a hash of its
token ids, `SpoolItem.prompt`, the paired test's cluster), and the first new prompts while fewer than
`min_holdout_prompts` are, never more than half of those seen. A prompt keeps its side (rebuilt from the shards at a
resume). Held out by arrival, a GRPO sibling of a trained sample (often the same text) would be scored, and a
memorising drafter would win.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from gleanrl.base.atomic import atomic_file, remove_stale_temporaries
from gleanrl.base.flags import check_fields, flag


@dataclass(slots=True)
class SpoolConfig:
    max_mem_tokens: int = flag(200_000, "harvested tokens kept in memory (oldest evicted)", name="spool_mem_tokens")
    max_mem_bytes: int = 1 << 30
    max_disk_tokens: int = flag(2_000_000, "harvested tokens kept on disk (oldest evicted)", name="spool_disk_tokens")
    max_disk_bytes: int = flag(4 << 30, "spool bytes kept on disk (oldest evicted)", name="spool_disk_bytes")
    version_decay: float = flag(0.5, "sampling weight per policy version behind the newest (1: uniform)")
    holdout_every: int = flag(8, "one prompt in N is held out, with all its samples (0: none)")

    def __post_init__(self) -> None:
        check_fields(self, ("max_mem_tokens", "max_mem_bytes", "max_disk_tokens", "max_disk_bytes"))
        if not 0.0 < self.version_decay <= 1.0:
            raise ValueError(f"version_decay must be in (0, 1], got {self.version_decay}")
        if self.holdout_every < 0 or self.holdout_every == 1:
            raise ValueError("holdout_every must be 0 (no holdout) or >= 2")


@dataclass(slots=True)
class SpoolItem:
    seq: int  # monotonic over the spool's life, also across resumes
    policy_version: int
    holdout: bool
    tensors: dict[str, torch.Tensor]
    prompt: int = 0  # hash of the prompt's token ids (prompt_key)

    @property
    def tokens(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def window(self, max_tokens: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """At most `max_tokens` consecutive tokens of every tensor (all if 0 or it fits), from a random start
        (fixed per `seq` without `generator`) leaving at least half a window of response tokens where there are
        that many. Cost grows with the square of the length: long rollouts are learned in windows."""
        T = self.tokens
        if not max_tokens or T <= max_tokens:
            return self.tensors
        mask = self.tensors.get("loss_mask")
        first = int(mask.int().argmax()) if mask is not None and bool(mask.any()) else 0
        lo, hi = min(max(first - max_tokens // 2, 0), T - max_tokens), T - max_tokens
        gen = generator or torch.Generator().manual_seed(self.seq)
        start = int(torch.randint(lo, hi + 1, (), generator=gen))
        return {k: v[start : start + max_tokens] for k, v in self.tensors.items()}


def prompt_key(tensors: dict[str, torch.Tensor]) -> int:
    """A stable 63-bit hash of the prompt tokens (outside `loss_mask`; all without one), the same in every process."""
    ids, mask = tensors["input_ids"], tensors.get("loss_mask")
    prompt = ids[~mask.bool()] if mask is not None else ids
    digest = hashlib.blake2b(prompt.to(torch.int64).numpy().tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Spool:
    """Thread-safe: the trainer adds while the idle-window drafter trainer samples."""

    def __init__(self, directory: str | Path | None, cfg: SpoolConfig | None = None, min_holdout_prompts: int = 4):
        self.cfg = cfg or SpoolConfig()
        self.min_holdout_prompts = min_holdout_prompts
        self._seen: set[int] = set()  # prompt keys, held out or not
        self._held: set[int] = set()  # prompt keys held out
        self.dir = Path(directory) if directory is not None else None
        self._lock = threading.Lock()
        self._mem: OrderedDict[int, SpoolItem] = OrderedDict()
        self._disk: OrderedDict[int, tuple[Path, int, int]] = OrderedDict()  # seq -> (path, tokens, bytes)
        self._next_seq = 0
        self.mem_tokens = self.mem_bytes = self.disk_tokens = self.disk_bytes = 0  # what the spool holds now
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._reload()

    def add(self, tensors: dict[str, torch.Tensor], policy_version: int) -> SpoolItem:
        if "input_ids" not in tensors:
            raise ValueError("a spool sample needs 'input_ids'")
        T = tensors["input_ids"].shape[0]
        for name, t in tensors.items():
            if t.dim() == 0 or t.shape[0] != T:
                raise ValueError(f"tensor {name!r} has shape {tuple(t.shape)}; its first dim must be {T} tokens")
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            key = prompt_key(tensors)
            holdout = self._side(key)
            item = SpoolItem(seq, int(policy_version), holdout, tensors, key)
            if self.dir is not None:
                path = self.dir / f"{seq:010d}.safetensors"
                meta = {"policy_version": str(item.policy_version), "holdout": str(int(holdout)), "prompt": str(key)}
                with atomic_file(path) as f:
                    f.write(save(tensors, metadata=meta))
                self._index_disk(seq, path, item.tokens)
                self._evict_disk()
            self._mem[seq] = item
            self.mem_tokens, self.mem_bytes = self.mem_tokens + item.tokens, self.mem_bytes + item.nbytes
            self._evict_mem()
            return item

    def _side(self, key: int) -> bool:
        """Whether prompt `key` is held out: decided at its first sample, kept for good."""
        if key not in self._seen:
            every, half = self.cfg.holdout_every, (len(self._seen) + 1) / 2
            # never more than half held out: the drafter must have prompts to train on
            early = len(self._held) < min(self.min_holdout_prompts, half)
            if every > 0 and (early or key % every == 0 and len(self._held) < half):
                self._held.add(key)
            self._seen.add(key)
        return key in self._held

    def _evict_mem(self) -> None:
        cfg = self.cfg
        while len(self._mem) > 1 and (self.mem_tokens > cfg.max_mem_tokens or self.mem_bytes > cfg.max_mem_bytes):
            _, item = self._mem.popitem(last=False)
            self.mem_tokens, self.mem_bytes = self.mem_tokens - item.tokens, self.mem_bytes - item.nbytes

    def _evict_disk(self) -> None:
        cfg = self.cfg
        while len(self._disk) > 1 and (self.disk_tokens > cfg.max_disk_tokens or self.disk_bytes > cfg.max_disk_bytes):
            _, (path, tokens, size) = self._disk.popitem(last=False)
            self.disk_tokens, self.disk_bytes = self.disk_tokens - tokens, self.disk_bytes - size
            path.unlink(missing_ok=True)

    def _index_disk(self, seq: int, path: Path, tokens: int) -> None:
        size = path.stat().st_size
        self._disk[seq] = (path, tokens, size)
        self.disk_tokens, self.disk_bytes = self.disk_tokens + tokens, self.disk_bytes + size

    def _reload(self) -> None:
        """Resume: index the shards on disk, keep the newest within the disk limits, load the newest."""
        remove_stale_temporaries(self.dir)  # shards a killed process was writing
        metas: dict[int, dict] = {}
        for path in sorted(self.dir.glob("[0-9]*.safetensors")):  # zero-padded names sort by seq
            with safe_open(path, "pt") as f:
                tokens = int(f.get_slice("input_ids").get_shape()[0])
                meta = metas[int(path.stem)] = f.metadata() or {}
            if "prompt" in meta:  # each prompt's side, as it was decided
                self._seen.add(int(meta["prompt"]))
                if meta.get("holdout") == "1":
                    self._held.add(int(meta["prompt"]))
            self._index_disk(int(path.stem), path, tokens)
            self._next_seq = int(path.stem) + 1
        self._evict_disk()
        budget_tokens, budget_bytes, newest = 0, 0, []
        for seq, (path, tokens, _) in reversed(self._disk.items()):
            meta, tensors = metas[seq], load_file(path)
            key = int(meta["prompt"]) if "prompt" in meta else prompt_key(tensors)
            item = SpoolItem(seq, int(meta.get("policy_version", 0)), meta.get("holdout") == "1", tensors, key)
            budget_tokens, budget_bytes = budget_tokens + tokens, budget_bytes + item.nbytes
            if newest and (budget_tokens > self.cfg.max_mem_tokens or budget_bytes > self.cfg.max_mem_bytes):
                break
            newest.append(item)
        self._mem = OrderedDict((it.seq, it) for it in reversed(newest))
        self.mem_tokens, self.mem_bytes = sum(it.tokens for it in newest), sum(it.nbytes for it in newest)

    def prompt_counts(self) -> tuple[int, int]:
        """(prompts seen, prompts held out)."""
        with self._lock:
            return len(self._seen), len(self._held)

    def sample(self, n: int, generator: torch.Generator | None = None) -> list[SpoolItem]:
        """`n` training samples drawn with replacement, favouring recent versions; [] if none."""
        with self._lock:
            items = [it for it in self._mem.values() if not it.holdout]
        if not items or n < 1:
            return []
        newest = max(it.policy_version for it in items)
        weights = torch.tensor([self.cfg.version_decay ** (newest - it.policy_version) for it in items])
        picks = torch.multinomial(weights, n, replacement=True, generator=generator)
        return [items[i] for i in picks.tolist()]

    def holdout(self, policy_version: int | None = None, versions: int = 1) -> list[SpoolItem]:
        """Held-out samples of `policy_version`, else of the `versions` newest versions having any."""
        with self._lock:
            held = [it for it in self._mem.values() if it.holdout]
        if policy_version is not None:
            return [it for it in held if it.policy_version == policy_version]
        keep = set(sorted({it.policy_version for it in held})[-versions:])
        return [it for it in held if it.policy_version in keep]

    @property
    def newest_version(self) -> int | None:
        with self._lock:
            return max((it.policy_version for it in self._mem.values()), default=None)

    def __len__(self) -> int:
        return len(self._mem)
