"""The drop-in Harvester: hand it finished rollouts and the current policy, let it train the drafter while you
wait on the rest, let it push a better drafter to the rollout server (scoring and pushing: `harvest.pushing`).

    h = Harvester(policy_dir, drafter_dir, spool_dir, push=DrafterPush(["http://127.0.0.1:30000"]))
    h.add_rollout(prompt_ids, output_ids, policy_model, policy_version)   # per finished rollout
    h.train_while(lambda: rollouts_in_flight)                              # idle window, preemptible
    h.maybe_push()                                                         # new version or None

Samples are trained and scored in windows of `max_tokens` (attention cost grows with the square of the length). A
new Harvester over the same directories serves the newest pushed drafter and trains on the spool on disk;
`state_dict()` (the drafter in training, its optimizer, counters, RNG) is in every trainer checkpoint.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from gleanrl.harvest.capture import Sample, capture
from gleanrl.harvest.checkpoint import drafter_versions, load_drafter
from gleanrl.harvest.config import HarvestConfig
from gleanrl.harvest.idle import CoreGate, IdleReport, IdleWindow, Waiting, run_window
from gleanrl.harvest.pushing import DrafterPushing, PushFn, Verdict
from gleanrl.harvest.spool import Spool
from gleanrl.harvest.train_step import bf16_fast, make_optimizer, train_step


class Harvester(DrafterPushing):
    def __init__(
        self,
        target: str | Path | torch.nn.Module,
        drafter_dir: str | Path,
        spool_dir: str | Path | None,
        push: PushFn | None = None,
        cfg: HarvestConfig | None = None,
    ):
        if push is not None and not callable(push):
            hint = "for server URLs pass gleanrl.clients.weight_sync.DrafterPush(urls)"
            raise TypeError(f"push must be fn(path, version) or None, got {push!r}; {hint}")
        self.cfg = cfg or HarvestConfig()
        self._target = target  # a model, or its directory (loaded on first use)
        if not isinstance(target, torch.nn.Module) and not (Path(target) / "config.json").is_file():
            raise ValueError(f"{target} is not a model directory (no config.json)")
        self.spool = Spool(spool_dir, self.cfg.spool, self.cfg.min_holdout_prompts)
        base = Path(spool_dir).parent if spool_dir is not None else Path(drafter_dir).parent
        self.versions_dir = Path(self.cfg.versions_dir or base / "drafter_versions")
        pushed = drafter_versions(self.versions_dir)
        self.version, start = pushed[-1] if pushed else (0, Path(drafter_dir))
        fit = target.config if isinstance(target, torch.nn.Module) else Path(target)
        self.drafter = load_drafter(start, target_config=fit)
        self.serving = copy.deepcopy(self.drafter)
        self._serving_scores: dict[int, tuple[float, int]] = {}
        self.optimizer = make_optimizer(self.drafter, lr=self.cfg.lr)
        self.layer_ids = list(self.drafter.config.aux_layer_ids)
        self._bf16 = bf16_fast(self.drafter.fc.weight.device) if self.cfg.bf16 is None else self.cfg.bf16
        self.push = push
        self._lock = threading.RLock()
        self._gen = torch.Generator().manual_seed(self.cfg.seed)
        self.steps, self.last_metrics, self.idle = 0, {}, IdleReport()
        self._since_push, self._closing = 0, threading.Event()  # set while an idle window closes
        self.history: list[dict] = []
        self._pending: tuple[dict, Verdict, str] | None = None
        self._pushed_this_step = False

    @property
    def target(self) -> torch.nn.Module:
        if not isinstance(self._target, torch.nn.Module):
            from transformers import AutoModelForCausalLM

            self._target = AutoModelForCausalLM.from_pretrained(self._target, dtype=torch.float32).eval()
        return self._target

    def add_rollout(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        policy_model: torch.nn.Module | None = None,
        policy_version: int = 0,
    ) -> None:
        """Capture one finished rollout with `policy_model` (default: the target), spool it; its output is learned."""
        if not output_ids:
            return
        model = policy_model if policy_model is not None else self.target
        version = int(policy_version)
        [sample] = capture(
            model,
            [list(prompt_ids) + list(output_ids)],
            self.layer_ids,
            self.cfg.topk,
            prompt_lens=[len(prompt_ids)],
            policy_version=version,
            aux_dtype=getattr(torch, self.cfg.aux_dtype),
            bf16=self._bf16,
        )
        self.spool.add(sample.tensors(), version)

    def add_sample(self, sample: Sample, policy_version: int) -> None:
        """Spool a sample captured elsewhere (e.g. from the policy update's forward)."""
        width, hidden, n = sample.aux_hidden.shape[-1], self.drafter.config.target_hidden_size, len(self.layer_ids)
        if width != n * hidden:
            raise ValueError(f"aux_hidden has width {width}; the drafter takes {n} layers of {hidden}")
        self.spool.add(sample.tensors(), int(policy_version))

    def train_micro_step(self) -> dict | None:
        """One optimizer step on a recency-weighted batch from the spool; None if it is empty."""
        if not (batch := self.spool.sample(self.cfg.batch_size, self._gen)):
            return None
        with self._lock:
            windows = [it.window(self.cfg.max_tokens, self._gen) for it in batch]
            length = self.cfg.ttt_length
            self.last_metrics = train_step(self.drafter, self.optimizer, windows, length=length, bf16=self._bf16)
            self.steps += 1
        self._since_push += 1
        if self.cfg.push_every and self._since_push >= self.cfg.push_every and not self._closing.is_set():
            self._since_push = 0  # (no push starts once the window is closing)
            try:
                if self.maybe_push(stop=self._closing.is_set, boundary=False) is None and self._closing.is_set():
                    self._since_push = self.cfg.push_every  # abandoned as the window closed: retry next
            except Exception as exc:
                self.push_failed(exc)
        return self.last_metrics

    def train_while(self, waiting: Waiting, max_steps: int | None = None) -> IdleReport:
        """Train in this thread while `waiting` is open (a callable returning True, or a set Event)."""
        self._closing.clear()
        report = run_window(self._idle_step, waiting, max_steps)
        self.idle = self.idle.merge(report)
        return report

    def idle_window(self, extra: Callable[[], bool] | None = None, cores: CoreGate | None = None) -> IdleWindow:
        """A background-thread window (`with h.idle_window(): ...`). `extra()` runs first in each micro-step;
        True means it did its work (e.g. a capture). `cores`: only on free cores (`harvest.idle`)."""

        def step() -> bool:
            return True if extra is not None and extra() else self._idle_step()

        return _ReportingWindow(step, self, cores)

    def _idle_step(self) -> bool:
        if self.train_micro_step() is None:
            threading.Event().wait(0.01)  # nothing to learn yet: yield instead of spinning
            return False
        return True

    def state_dict(self) -> dict:
        """What a resume needs beyond the spool and pushed versions on disk (call between windows)."""
        with self._lock:
            return {
                "drafter": {k: v.detach().clone() for k, v in self.drafter.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "version": self.version,
                "steps": self.steps,
                "since_push": self._since_push,
                "rng": self._gen.get_state(),
            }

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`. The serving drafter stays the newest pushed on disk, which may be newer
        than `state`: version numbers never repeat."""
        with self._lock:
            self.drafter.load_state_dict(state["drafter"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = max(self.version, int(state["version"]))
            self.steps, self._since_push = int(state["steps"]), int(state["since_push"])
            self._gen.set_state(state["rng"])


class _ReportingWindow(IdleWindow):
    def __init__(self, step: Callable[[], object], harvester: Harvester, cores: CoreGate | None = None):
        super().__init__(step, nice=harvester.cfg.idle_nice, cores=cores)
        self._harvester = harvester

    def open(self) -> IdleWindow:
        self._harvester._closing.clear()
        return super().open()

    def close(self) -> IdleReport:
        self._harvester._closing.set()
        report = super().close()
        self._harvester.idle = self._harvester.idle.merge(report)
        return report
