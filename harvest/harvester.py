"""The drop-in Harvester: hand it finished rollouts and the current policy, let it train the drafter
while you wait on the rest, let it push a better drafter to the rollout server.

    h = Harvester(policy_dir, drafter_dir, spool_dir, push=DrafterPush(["http://127.0.0.1:30000"]))
    h.add_rollout(prompt_ids, output_ids, policy_model, policy_version)   # per finished rollout
    h.train_while(lambda: rollouts_in_flight)                              # idle window, preemptible
    h.maybe_push()                                                         # new version or None

`push(path, version)` sends a drafter checkpoint to the rollout server(s) and raises when it is
refused or cannot be sent (`gleanrl.clients.weight_sync.DrafterPush`, or any callable; None keeps
checkpoints only). Nothing in `harvest` knows a server: the trainer or the caller hands the function
in. A push that raises leaves the serving version as it was; inside training it is recorded in
`history` and training goes on (RL must not stop for it).

A candidate is pushed only if its expected acceptance length on held-out prompts of the newest
policy versions (prompts never trained on: the spool holds out by prompt) beats the serving
drafter's on the same samples significantly: a paired test clustered by prompt whose lower bound
clears `min_gain` (`harvest.push_rule`), with at least `min_holdout_prompts` prompts and
`min_holdout_samples` samples. At most one push a step: a candidate that wins inside the step's idle
window waits for the step boundary (`new_step()`, or a `maybe_push()` between steps), unless its
lower bound clears `mid_step_gain`, a margin that pays for a swap while rollouts run. Versions
increase by one per push. Samples are trained on and scored in
windows of `max_tokens`: attention cost grows with the square of the length, and a long-tail rollout
in a batch would otherwise make one micro-step take seconds, leaving the idle window almost no
steps. Pushed drafters go to `versions_dir/v000007` (EAGLE-3 format, atomic; a refused one is
removed), and a new Harvester over the same directories serves the newest of them and trains on the
spool on disk. `state_dict()` / `load_state_dict()` carry the drafter in training (which continues
from the serving weights, never from scratch), its optimizer, counters and sampling RNG; gleanrl's
trainer saves them in every step checkpoint, so `--resume` continues where that checkpoint left off.
"""

from __future__ import annotations

import copy
import inspect
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gleanrl.base.flags import flag
from gleanrl.harvest.acceptance import acceptance_sums
from gleanrl.harvest.capture import Sample, capture
from gleanrl.harvest.checkpoint import drafter_dir, drafter_versions, load_drafter, save_drafter
from gleanrl.harvest.idle import CoreGate, IdleReport, IdleWindow, Waiting, run_window
from gleanrl.harvest.push_rule import Gate, Verdict, paired_verdict
from gleanrl.harvest.spool import Spool, SpoolConfig
from gleanrl.harvest.train_step import bf16_fast, make_optimizer, train_step

PushFn = Callable[[str, int], None]


@dataclass(slots=True)
class HarvestConfig:
    topk: int = flag(32, "soft-label width kept per harvested token", name="drafter_topk")
    batch_size: int = flag(4, "harvested samples per drafter micro-step", name="drafter_batch_size")
    # continual from the serving weights: 1e-3 first dips below a good warm start
    lr: float = flag(
        3e-4, "drafter AdamW learning rate (training continues from the serving weights)", name="drafter_lr"
    )
    ttt_length: int = 4  # unrolled draft steps, in training and in scoring
    max_tokens: int = flag(
        128,
        "window of each sample trained on and scored (0: whole samples; cost grows with its square)",
        name="drafter_max_tokens",
    )
    accept_mode: str = flag(
        "sampled",
        "held-out score: expected acceptance of speculative "
        "sampling ('sampled', rollouts at T=1) or the greedy chain "
        "('greedy')",
        choices=["sampled", "greedy"],
    )
    # bf16 autocast in capture and training (None: where it pays)
    bf16: bool | None = None
    idle_nice: int = flag(
        0,
        "CPU priority (nice 0-19) of the drafter's idle-window thread; "
        "19: it uses only compute nobody else wants, and starves on a "
        "busy machine",
    )
    push_every: int = flag(25, "drafter micro-steps between score-and-push attempts (0: never push)")
    min_gain: float = flag(
        0.02, "tokens per verify pass the paired gain's lower bound must clear to push (harvest.push_rule)"
    )
    mid_step_gain: float = flag(0.3, "...to push inside a step, while rollouts run (else at the step boundary)")
    confidence_z: float = flag(2.0, "the push test's lower bound: gain - t(z, prompts - 1) * se")
    min_holdout_prompts: int = flag(4, "held-out prompts a push attempt needs")
    min_holdout_samples: int = flag(8, "held-out samples a push attempt needs")
    max_holdout: int = flag(48, "held-out samples (newest) scored per push attempt")
    holdout_versions: int = flag(4, "...from this many newest policy versions (1: the current one only)")
    keep_versions: int = flag(3, "pushed drafter versions kept on disk")
    aux_dtype: str = flag("float32", "spool storage of hidden states", choices=["float32", "bfloat16", "float16"])
    # capture early finishers in the idle window (else: from the update)
    mid_step_capture: bool = False
    seed: int = 0
    versions_dir: str | None = None  # default: <spool_dir>/../drafter_versions
    spool: SpoolConfig = field(default_factory=SpoolConfig)

    def __post_init__(self) -> None:
        for name in (
            "topk",
            "batch_size",
            "ttt_length",
            "max_holdout",
            "holdout_versions",
            "keep_versions",
            "min_holdout_samples",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.push_every < 0 or self.min_gain < 0 or self.confidence_z < 0:
            raise ValueError("lr must be > 0, push_every, min_gain and confidence_z >= 0")
        if self.mid_step_gain < self.min_gain:
            raise ValueError(f"mid_step_gain must be >= min_gain ({self.min_gain}), got {self.mid_step_gain}")
        if self.min_holdout_prompts < 2:
            raise ValueError(
                f"min_holdout_prompts must be >= 2 (a standard error needs two), got {self.min_holdout_prompts}"
            )
        if not 0 <= self.idle_nice <= 19:
            raise ValueError(f"idle_nice must be in [0, 19], got {self.idle_nice}")
        if self.max_tokens < 0 or self.max_tokens in (1, 2):
            raise ValueError(f"max_tokens must be 0 (whole samples) or >= 3, got {self.max_tokens}")
        if self.accept_mode not in ("sampled", "greedy"):
            raise ValueError(f"accept_mode must be 'sampled' or 'greedy', got {self.accept_mode!r}")
        if self.aux_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"aux_dtype must be float32, bfloat16 or float16, got {self.aux_dtype!r}")


class Harvester:
    def __init__(
        self,
        target: str | Path | torch.nn.Module,
        drafter_dir: str | Path,
        spool_dir: str | Path | None,
        push: PushFn | None = None,
        cfg: HarvestConfig | None = None,
    ):
        if push is not None and not callable(push):
            raise TypeError(
                f"push must be fn(path, version) or None, got {push!r}; for "
                "server URLs pass gleanrl.clients.weight_sync.DrafterPush(urls)"
            )
        self.cfg = cfg or HarvestConfig()
        # a model, or its directory (loaded on first use: the trainer passes its own)
        self._target = target
        if not isinstance(target, torch.nn.Module) and not (Path(target) / "config.json").is_file():
            raise ValueError(f"{target} is not a model directory (no config.json)")
        self.spool = Spool(spool_dir, self.cfg.spool, self.cfg.min_holdout_prompts)
        base = Path(spool_dir).parent if spool_dir is not None else Path(drafter_dir).parent
        self.versions_dir = Path(self.cfg.versions_dir or base / "drafter_versions")
        self.version, start = self._latest_pushed() or (0, Path(drafter_dir))
        fit = target.config if isinstance(target, torch.nn.Module) else Path(target)
        self.drafter = load_drafter(start, target_config=fit)
        self.serving = copy.deepcopy(self.drafter)
        # spool seq -> the serving drafter's score
        self._serving_scores: dict[int, tuple[float, int]] = {}
        self.optimizer = make_optimizer(self.drafter, lr=self.cfg.lr)
        self.layer_ids = list(self.drafter.config.aux_layer_ids)
        self._bf16 = bf16_fast(self.drafter.fc.weight.device) if self.cfg.bf16 is None else self.cfg.bf16
        self.push = push
        self._lock = threading.RLock()  # drafter, optimizer and serving copy
        self._gen = torch.Generator().manual_seed(self.cfg.seed)
        self.steps, self.last_metrics, self.idle = 0, {}, IdleReport()
        # set while an idle window is closing
        self._since_push, self._closing = 0, threading.Event()
        # one row per push attempt: version, the verdict's figures, when, pushed
        self.history: list[dict] = []
        # a candidate that won inside a step: (its weights, verdict), pushed at the boundary
        self._pending: tuple[dict, Verdict, str] | None = None
        self._pushed_this_step = False

    @property
    def gate(self) -> Gate:
        cfg = self.cfg
        return Gate(cfg.min_holdout_prompts, cfg.min_holdout_samples, cfg.min_gain, cfg.mid_step_gain)

    @property
    def target(self) -> torch.nn.Module:
        if not isinstance(self._target, torch.nn.Module):
            from transformers import AutoModelForCausalLM

            self._target = AutoModelForCausalLM.from_pretrained(self._target, dtype=torch.float32).eval()
        return self._target

    def _latest_pushed(self) -> tuple[int, Path] | None:
        found = drafter_versions(self.versions_dir)
        return found[-1] if found else None

    # -- harvest ---------------------------------------------------------------------------------
    def add_rollout(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        policy_model: torch.nn.Module | None = None,
        policy_version: int = 0,
    ) -> None:
        """Capture one finished rollout with `policy_model` (default: the target) and spool it.
        Only the output tokens are learned; the prompt gives context."""
        if not output_ids:
            return
        model = policy_model if policy_model is not None else self.target
        [sample] = capture(
            model,
            [list(prompt_ids) + list(output_ids)],
            self.layer_ids,
            self.cfg.topk,
            prompt_lens=[len(prompt_ids)],
            policy_version=int(policy_version),
            aux_dtype=getattr(torch, self.cfg.aux_dtype),
            bf16=self._bf16,
        )
        self.spool.add(sample.tensors(), int(policy_version))

    def add_sample(self, sample: Sample, policy_version: int) -> None:
        """Spool a sample captured elsewhere (e.g. from the policy update's forward)."""
        width = sample.aux_hidden.shape[-1]
        if width != len(self.layer_ids) * self.drafter.config.target_hidden_size:
            raise ValueError(
                f"aux_hidden has width {width}; the drafter "
                f"takes {len(self.layer_ids)} layers "
                f"of {self.drafter.config.target_hidden_size}"
            )
        self.spool.add(sample.tensors(), int(policy_version))

    # -- train -----------------------------------------------------------------------------------
    def train_micro_step(self) -> dict | None:
        """One optimizer step on a recency-weighted batch from the spool; None if the
        spool is empty."""
        batch = self.spool.sample(self.cfg.batch_size, self._gen)
        if not batch:
            return None
        with self._lock:
            windows = [it.window(self.cfg.max_tokens, self._gen) for it in batch]
            self.last_metrics = train_step(
                self.drafter, self.optimizer, windows, length=self.cfg.ttt_length, bf16=self._bf16
            )
            self.steps += 1
        self._since_push += 1
        if self.cfg.push_every and self._since_push >= self.cfg.push_every and not self._closing.is_set():
            # a push is not started once the window is closing: it waits for the next
            self._since_push = 0
            try:
                if self.maybe_push(stop=self._closing.is_set, boundary=False) is None and self._closing.is_set():
                    # abandoned as the window closed: retry in the next
                    self._since_push = self.cfg.push_every
            except Exception as exc:
                # whatever the push function raises: the server keeps the old drafter
                self.history.append({"version": self.version, "pushed": False, "error": f"{type(exc).__name__}: {exc}"})
        return self.last_metrics

    def train_while(self, waiting: Waiting, max_steps: int | None = None) -> IdleReport:
        """Train in this thread while `waiting` is open (a callable returning True, or
        a set Event)."""
        self._closing.clear()
        report = run_window(self._idle_step, waiting, max_steps)
        self.idle = self.idle.merge(report)
        return report

    def idle_window(self, extra: Callable[[], bool] | None = None, cores: CoreGate | None = None) -> IdleWindow:
        """A background-thread window (`with h.idle_window(): ...`). `extra()` runs first in each
        micro-step; returning True means it did the micro-step's work (e.g. a pending capture).
        `cores`: only on the cores it says are free (`harvest.idle`)."""

        def step() -> bool:
            return True if extra is not None and extra() else self._idle_step()

        return _ReportingWindow(step, self, cores)

    def _idle_step(self) -> bool:
        if self.train_micro_step() is None:
            threading.Event().wait(0.01)  # nothing to learn yet: yield instead of spinning
            return False
        return True

    # -- score and push --------------------------------------------------------------------------
    def score(
        self,
        drafter: torch.nn.Module | None = None,
        policy_version: int | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> float | None:
        """Expected acceptance length (`accept_mode`) on the fixed windows of held-out samples of
        `policy_version` (default: the newest `holdout_versions` versions, at most `max_holdout`
        newest samples); None if there are none, or if `stop()` turned true (checked every 4
        samples). The serving drafter's per-sample scores are cached until a push."""
        return self._score(drafter, self._held(policy_version), stop)

    def _held(self, policy_version: int | None = None) -> list:
        """At most `max_holdout` held-out samples, spread over as many prompts as they can cover
        (each prompt's newest first, newest prompts first), in spool order: the newest samples
        alone would all be one GRPO group's, and the gate needs `min_holdout_prompts` prompts."""
        by_prompt: dict[int, list] = {}
        for it in reversed(self.spool.holdout(policy_version, self.cfg.holdout_versions)):
            by_prompt.setdefault(it.prompt, []).append(it)
        picked, depth = [], 0
        while len(picked) < self.cfg.max_holdout and any(len(g) > depth for g in by_prompt.values()):
            picked += [g[depth] for g in by_prompt.values() if len(g) > depth]
            depth += 1
        return sorted(picked[: self.cfg.max_holdout], key=lambda it: it.seq)

    def _score(self, drafter: torch.nn.Module | None, held: list, stop: Callable[[], bool] | None) -> float | None:
        sums = self._sums(drafter, held, stop)
        if sums is None:
            return None
        return sum(s for s, _ in sums) / max(sum(c for _, c in sums), 1)

    def _sums(
        self, drafter: torch.nn.Module | None, held: list, stop: Callable[[], bool] | None
    ) -> list[tuple[float, int]] | None:
        """Per held-out sample (sum of accept lengths, slots); None if none, or stopped."""
        if not held:
            return None
        with self._lock:
            drafter = drafter or self.drafter
            cache = self._serving_scores if drafter is self.serving else {}
            todo = [it for it in held if it.seq not in cache]
            for lo in range(0, len(todo), 4):
                if stop is not None and stop():
                    return None
                chunk = todo[lo : lo + 4]
                sums = acceptance_sums(
                    drafter,
                    [it.window(self.cfg.max_tokens) for it in chunk],
                    k=self.cfg.ttt_length,
                    mode=self.cfg.accept_mode,
                )
                cache.update({it.seq: s for it, s in zip(chunk, sums)})
            return [cache[it.seq] for it in held]

    def maybe_push(self, stop: Callable[[], bool] | None = None, boundary: bool = True) -> int | None:
        """Score the trained drafter against the serving one on the same held-out samples and push
        it if it wins significantly (`harvest.push_rule`); the new version or None. `boundary`:
        called between steps (a caller's loop; it starts a new step's push budget), else inside a
        step (the idle window): one push a step, and a winner below `mid_step_gain` waits for
        `new_step()`. `stop()` turning true before the push starts abandons the attempt."""
        with self._lock:
            if boundary:
                self._pushed_this_step, self._pending = False, None
            elif self._pushed_this_step:
                return None
            held = self._held()  # both on the same samples, whatever is harvested meanwhile
            candidate = self._sums(self.drafter, held, stop)
            serving = self._sums(self.serving, held, stop)
            if stop is not None and stop() or candidate is None or serving is None:
                return None
            verdict = paired_verdict(candidate, serving, [it.prompt for it in held], self.cfg.confidence_z)
            action, why = self.gate.decide(verdict, boundary)
            row = {
                "version": self.version,
                "when": "boundary" if boundary else "mid_step",
                **(verdict.row() if verdict else {}),
                "why": why + self._holdout_context(verdict),
            }
            if action == "hold":
                self.history.append(row | {"pushed": False})
                return None
            if action == "pending":
                if self._pending is None or verdict.lower > self._pending[1].lower:
                    self._pending = (copy.deepcopy(self.drafter.state_dict()), verdict, why)
                self.history.append(row | {"pushed": False, "pending": True})
                return None
            return self._push(self.drafter, row)

    def _holdout_context(self, verdict: Verdict | None) -> str:
        """Why held-out prompts may be few: how many the spool holds out of those it has seen."""
        if verdict is not None and verdict.prompts >= self.cfg.min_holdout_prompts:
            return ""
        seen, held = self.spool.prompt_counts()
        return (
            f" ({held} of the {seen} prompts seen so far are held out: the first new ones, "
            f"then 1 in {self.cfg.spool.holdout_every}, never more than half: a loop that "
            "reuses a few prompts has few to hold out)"
        )

    def push_status(self, attempt: dict | None = None) -> str:
        """The gate's last word in a line: `attempt`'s outcome (a `history` row), else how far the
        next attempt is."""
        if attempt is None:
            if not self.cfg.push_every:
                return "pushes off"
            if self._since_push >= self.cfg.push_every:
                return "a push attempt is due at the next micro-step (the last window closed first)"
            return (
                f"no push attempt yet: {self._since_push} of the {self.cfg.push_every} "
                "drafter micro-steps between attempts"
            )
        if attempt.get("error"):
            return f"push refused: {attempt['error']}"
        done = (
            "pushed v{}".format(attempt["version"])
            if attempt.get("pushed")
            else "won, waits for the step boundary"
            if attempt.get("pending")
            else "held"
        )
        return f"{done}: {attempt.get('why', '')}"

    def new_step(self) -> int | None:
        """The step boundary: push the best candidate that won inside the last step (no rescoring;
        it won on held-out data already); the new version or None. Starts the step's push
        budget."""
        with self._lock:
            pending, self._pending, self._pushed_this_step = self._pending, None, False
            if pending is None:
                return None
            drafter = copy.deepcopy(self.serving)
            drafter.load_state_dict(pending[0])
            return self._push(
                drafter,
                {"version": self.version, "when": "boundary", **pending[1].row(), "why": f"won mid-step: {pending[2]}"},
            )

    def _push(self, drafter: torch.nn.Module, row: dict) -> int:
        version = self.version + 1
        path = save_drafter(drafter, drafter_dir(self.versions_dir, version))
        try:
            self.push_checkpoint(str(path), version)
        except BaseException:
            # version and serving copy stay; no unpushed version is left to resume from
            shutil.rmtree(path, ignore_errors=True)
            raise
        self.version, self.serving = version, copy.deepcopy(drafter)
        # a candidate waiting for the boundary won against the drafter this push replaced: dropped
        self._serving_scores, self._pushed_this_step, self._pending = {}, True, None
        self.history.append(row | {"version": version, "pushed": True})
        self._prune()
        return version

    def push_checkpoint(self, path: str, version: int) -> None:
        """Call `push` (if any) on a saved drafter checkpoint; raises what it raises."""
        if self.push is None:
            return
        result = self.push(path, version)
        if inspect.isawaitable(result):
            # the idle-window thread cannot await the caller's event loop
            result.close()
            raise TypeError("push returned an awaitable: pass a blocking fn(path, version) such as DrafterPush")

    # -- resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What a resume needs beyond the spool and the pushed versions on disk (call
        between windows)."""
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
        """Continue from `state_dict()`. The serving drafter stays the newest pushed version on
        disk, which may be newer than `state` (pushed after it was saved): version numbers
        never repeat."""
        with self._lock:
            self.drafter.load_state_dict(state["drafter"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = max(self.version, int(state["version"]))
            self.steps, self._since_push = int(state["steps"]), int(state["since_push"])
            self._gen.set_state(state["rng"])

    def _prune(self) -> None:
        for _, path in drafter_versions(self.versions_dir)[: -self.cfg.keep_versions]:
            shutil.rmtree(path, ignore_errors=True)


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
