"""`gleanrl bootstrap`: train the built-in task's small policy from scratch by SFT on the task's reference solutions,
saved as a Hugging Face model directory (Llama, safetensors, character-level tokenizer, ChatML, eos = <|im_end|>).

Deterministic for a seed (on a given machine and thread count) and cached: `bootstrap.json` holds a key over every
argument (not the device), and a call with the same key returns at once. Sizes: "small" (the demo's), "deep" (its
32-layer peer, shaped like the LLMs SD serves), "tiny" (seconds, for tests), "gpu" (for `--device cuda`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# bump when a built-in task's format or the training recipe changes: it is in the key
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PolicySize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    train_tokens: int  # SFT tokens (padding included) drawn from the task's "train" split
    batch_tokens: int = 4096  # tokens per optimizer step, padding included
    lr: float = 1e-3
    context: int = 2048
    bf16: bool = True  # bf16 autocast: ~2.5x faster on AVX-512 CPUs; off for tiny (no gain)
    focus_weight: float = 1.0  # loss weight of the tokens the task's solution_focus names (trainer.tasks.sft)
    warmup: float = 0.05  # share of the steps with a linear lr warmup
    final_lr: float = 0.1  # the cosine schedule's last lr, a fraction of lr
    polish_steps: int = 0  # a last phase at the final lr with the focus tokens weighted
    polish_focus_weight: float = 1.0  # ...this much (trainer.tasks.sft.polish_policy)

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden must divide by heads and heads by kv_heads")
        if min(self.layers, self.train_tokens, self.batch_tokens, self.context) < 1 or self.lr <= 0:
            raise ValueError("layers, train_tokens, batch_tokens, context and lr must be positive")
        if self.focus_weight <= 0 or not 0 <= self.warmup < 1 or not 0 <= self.final_lr <= 1:
            raise ValueError("focus_weight must be > 0, warmup in [0, 1) and final_lr in [0, 1]")


SIZES = {
    # the polish phase: held-out reference accuracy 0.577 -> 0.696 (T = 1), greedy 0.688 -> 0.828
    # (docs/task-and-bootstrap.md, issue 30)
    # (hidden, layers, heads, kv_heads, intermediate, train_tokens, batch_tokens, lr, ...)
    "small": PolicySize(512, 6, 8, 8, 1536, 1_500_000, 2048, 1.5e-3, polish_steps=100, polish_focus_weight=10.0),
    # shaped like the LLMs SD serves (issue 38): small's parameters over 32 layers, so one EAGLE-3
    # drafter step (a layer of this width, its fc and head) costs <= ~0.1 of a target step
    "deep": PolicySize(256, 32, 4, 4, 512, 2_000_000, 2048, 1e-3, polish_steps=100, polish_focus_weight=10.0),
    "gpu": PolicySize(1024, 12, 16, 8, 2816, 3_000_000, 4096, 1e-3),
    "tiny": PolicySize(128, 2, 4, 2, 256, 400_000, 1024, 3e-3, bf16=False),
}


# recipe fields added after version 1: left out of the key at these values (the recipe they
# reproduce), so a policy built before they existed stays cached
_LATER_DEFAULTS = {"focus_weight": 1.0, "warmup": 0.05, "final_lr": 0.1, "polish_steps": 0, "polish_focus_weight": 1.0}


def cache_root() -> Path:
    return Path(os.environ.get("GLEANRL_CACHE") or Path.home() / ".cache" / "gleanrl")


def _spec_of(task) -> str:
    from gleanrl.trainer.tasks import DEFAULT_TASK

    return DEFAULT_TASK if task is None else task if isinstance(task, str) else repr(task)


def cache_key(task, seed: int, size: str) -> tuple[dict, str]:
    """(the arguments that define a bootstrap, their 12-hex-digit hash)."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}: choose one of {sorted(SIZES)}")
    recipe = {k: v for k, v in asdict(SIZES[size]).items() if k not in _LATER_DEFAULTS or v != _LATER_DEFAULTS[k]}
    params = {"version": FORMAT_VERSION, "task": _spec_of(task), "seed": seed, "size": recipe}
    return params, hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def bootstrap_policy(
    out_dir: str | os.PathLike | None = None,
    task=None,
    seed: int = 0,
    size: str = "small",
    progress: bool = True,
    device: str = "cpu",
) -> Path:
    """Train (or find in the cache) the task's policy; returns the model directory."""
    params, key = cache_key(task, seed, size)
    if out_dir is None:
        name = params["task"].split(":")[-1].split("(")[0].replace("/", "_")
        out_dir = cache_root() / "policies" / f"{name}-{size}-seed{seed}-{key}"
    out = Path(out_dir)
    if _cached(out, key):
        return out
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not (out / "bootstrap.json").exists():
        raise FileExistsError(f"{out} exists and is not a bootstrap output; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(f".{out.name}.lock"), "w") as lock:  # one builder per directory
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _cached(out, key):  # built by another process while we waited
            return out
        from gleanrl.base.atomic import atomic_dir
        from gleanrl.trainer.tasks import load_task
        from gleanrl.trainer.tasks.sft import train_policy

        start, cpu = time.time(), resource.getrusage(resource.RUSAGE_SELF)
        with atomic_dir(out) as tmp:
            stats = train_policy(tmp, load_task(task), SIZES[size], seed=seed, progress=progress, device=device)
            used = resource.getrusage(resource.RUSAGE_SELF)  # CPU time: wall time on a busy machine misleads
            cpu_s = round(used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime, 1)
            stats.update(key=key, params=params, seconds=round(time.time() - start, 1), cpu_seconds=cpu_s)
            (tmp / "bootstrap.json").write_text(json.dumps(stats, indent=1))
    return out


def _cached(out: Path, key: str) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((out / "bootstrap.json").read_text()).get("key") == key
    return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default=None, help="built-in task name or module:object (default: doubling)")
    parser.add_argument(
        "--out", default=None, help="model directory (default: a cache dir under $GLEANRL_CACHE or ~/.cache/gleanrl)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    parser.add_argument("--size", choices=sorted(SIZES), default="small", help="policy shape")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the policy trains")


def run(args: argparse.Namespace) -> int:
    from gleanrl.trainer.tasks import TaskError

    try:
        path = bootstrap_policy(args.out, task=args.task, seed=args.seed, size=args.size, device=args.device)
    except (TaskError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stats = json.loads((path / "bootstrap.json").read_text())
    print(f"policy: {path} ({stats['parameters'] / 1e6:.1f}M parameters, trained in {stats['seconds']} s)")
    if "heldout_reference_accuracy" in stats:
        acc = stats["heldout_reference_accuracy"]
        t1 = f"T = 1 {acc['expected']:.3f} ± {acc['expected_se']:.3f}, greedy {acc['greedy']:.3f}"
        print(f"held-out accuracy ({acc['n']} test prompts, from the reference solutions' probabilities): {t1}")
    return 0
