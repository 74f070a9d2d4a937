"""The Harvester's score-and-push half: when a trained drafter replaces the serving one, and how.

`push(path, version)` (handed in: `clients.weight_sync.DrafterPush` or any callable; None: checkpoints only) sends
a drafter to the server(s), raising when refused; `harvest` knows no server. A push that raises keeps the serving
version; in training it goes into `history` and training goes on (RL must not stop). Versions go up by one per push,
to `versions_dir/v000007` (EAGLE-3, atomic; a refused one removed; newest `keep_versions` kept).

The gate, a paired test: both drafters are scored on the same held-out samples of the newest policy versions (never
trained on; `pick_holdout` spreads over prompts), each giving (sum of accept lengths, start slots). One prompt's
samples are not independent (GRPO siblings, later steps), so the test clusters by prompt: with D_c the candidate's
minus the serving drafter's summed accept lengths over prompt c and N_c its slots, the gain in tokens per verify pass
is G = sum D_c / sum N_c, its cluster-robust se^2 = C/(C-1) sum_c (D_c - G N_c)^2 / (sum_c N_c)^2 (C prompts). A push
needs `min_holdout_prompts` prompts, `min_holdout_samples` samples and the lower bound G - t se above `min_gain` (t:
Student's quantile at z's confidence, C - 1 degrees of freedom: few prompts need more evidence). One push a step at
most: a winner in the idle window waits for the boundary (`new_step()`, or `maybe_push()` between steps) unless its
lower bound clears `mid_step_gain`. `Gate.decide` says which, and why in words.
"""

from __future__ import annotations

import copy
import inspect
import math
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gleanrl.harvest.checkpoint import drafter_dir, drafter_versions, save_drafter
from gleanrl.harvest.config import HarvestConfig
from gleanrl.harvest.spool import Spool
from gleanrl.harvest.train_step import acceptance_sums

PushFn = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class Verdict:
    gain: float  # tokens per verify pass, candidate minus serving
    se: float  # cluster-robust standard error of the gain
    lower: float  # gain - t * se
    prompts: int
    samples: int
    candidate: float  # pooled accept lengths
    serving: float

    def row(self) -> dict:
        row = {"candidate": self.candidate, "serving": self.serving, "gain": self.gain, "gain_se": self.se}
        return row | {"gain_lower": self.lower, "prompts": self.prompts, "samples": self.samples}


def t_quantile(z: float, df: int) -> float:
    """Student's t quantile at the normal quantile z (Cornish-Fisher expansion to 1/df^2)."""
    if df < 1:
        return math.inf
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def paired_verdict(
    candidate: list[tuple[float, int]], serving: list[tuple[float, int]], prompts: list[int], z: float = 2.0
) -> Verdict | None:
    """Per held-out sample: the two drafters' (sum, count) and its prompt; None without slots."""
    clusters: dict[int, list[float]] = {}
    for (c, n), (s, _), key in zip(candidate, serving, prompts, strict=True):
        acc = clusters.setdefault(key, [0.0, 0.0, 0.0])
        acc[0] += c - s
        acc[1] += n
        acc[2] += s
    total = sum(n for _, n, _ in clusters.values())
    if not total:
        return None
    gain = sum(d for d, _, _ in clusters.values()) / total
    k = len(clusters)
    var = k / (k - 1) * sum((d - gain * n) ** 2 for d, n, _ in clusters.values()) / total**2 if k > 1 else math.inf
    se = math.sqrt(var)
    serve = sum(s for _, _, s in clusters.values()) / total
    return Verdict(gain, se, gain - t_quantile(z, k - 1) * se, k, len(candidate), serve + gain, serve)


@dataclass(frozen=True, slots=True)
class Gate:
    min_prompts: int
    min_samples: int
    min_gain: float
    mid_step_gain: float

    def decide(self, v: Verdict | None, boundary: bool) -> tuple[str, str]:
        """("push" | "pending" (won, but waits for the step boundary) | "hold", why)."""
        if v is None:
            return "hold", "no held-out sample of the newest policy versions yet"
        if v.prompts < self.min_prompts:
            return "hold", f"held-out prompts {v.prompts} of the {self.min_prompts} needed"
        if v.samples < self.min_samples:
            return "hold", f"held-out samples {v.samples} of the {self.min_samples} needed"
        figures = (
            f"gain {v.gain:+.3f} ± {v.se:.3f} tokens/pass ({v.candidate:.2f} vs "
            f"{v.serving:.2f}) on {v.prompts} prompts, lower bound {v.lower:+.3f}"
        )
        if v.lower <= self.min_gain:
            return "hold", f"{figures}: not above {self.min_gain}"
        if not boundary and v.lower <= self.mid_step_gain:
            return "pending", (f"{figures} (a swap while rollouts run needs a lower bound above {self.mid_step_gain})")
        return "push", figures


def status_line(attempt: dict | None, since_push: int, push_every: int) -> str:
    """A push attempt's outcome (`attempt`: a `Harvester.history` row), else how far the next attempt is."""
    if attempt is None:
        if not push_every:
            return "pushes off"
        if since_push >= push_every:
            return "a push attempt is due at the next micro-step (the last window closed first)"
        return f"no push attempt yet: {since_push} of the {push_every} drafter micro-steps between attempts"
    if attempt.get("error"):
        return f"push refused: {attempt['error']}"
    if attempt.get("pushed"):
        done = "pushed v{}".format(attempt["version"])
    else:
        done = "won, waits for the step boundary" if attempt.get("pending") else "held"
    return f"{done}: {attempt.get('why', '')}"


def pick_holdout(spool: Spool, cfg: HarvestConfig, policy_version: int | None = None) -> list:
    """At most `max_holdout` held-out samples over as many prompts as possible (newest first), in spool
    order: the newest alone would be one GRPO group's, and the gate needs `min_holdout_prompts` prompts."""
    by_prompt: dict[int, list] = {}
    for it in reversed(spool.holdout(policy_version, cfg.holdout_versions)):
        by_prompt.setdefault(it.prompt, []).append(it)
    picked, depth = [], 0
    while len(picked) < cfg.max_holdout and any(len(g) > depth for g in by_prompt.values()):
        picked += [g[depth] for g in by_prompt.values() if len(g) > depth]
        depth += 1
    return sorted(picked[: cfg.max_holdout], key=lambda it: it.seq)


def holdout_sums(
    drafter: torch.nn.Module,
    held: list,
    cfg: HarvestConfig,
    cache: dict[int, tuple[float, int]],
    stop: Callable[[], bool] | None = None,
) -> list[tuple[float, int]] | None:
    """Per held-out sample (sum of accept lengths, slots), filling `cache` (by spool seq); None if there are
    none, or `stop()` turned true (checked every 4 samples)."""
    if not held:
        return None
    todo = [it for it in held if it.seq not in cache]
    for lo in range(0, len(todo), 4):
        if stop is not None and stop():
            return None
        chunk = todo[lo : lo + 4]
        windows = [it.window(cfg.max_tokens) for it in chunk]
        sums = acceptance_sums(drafter, windows, k=cfg.ttt_length, mode=cfg.accept_mode)
        cache.update({it.seq: s for it, s in zip(chunk, sums)})
    return [cache[it.seq] for it in held]


def few_prompts_note(spool: Spool, cfg: HarvestConfig, verdict: Verdict | None) -> str:
    """Why held-out prompts may be few: how many the spool holds out of those it has seen."""
    if verdict is not None and verdict.prompts >= cfg.min_holdout_prompts:
        return ""
    seen, held = spool.prompt_counts()
    rule = f"the first new ones, then 1 in {cfg.spool.holdout_every}, never more than half"
    why = "a loop that reuses a few prompts has few to hold out"
    return f" ({held} of the {seen} prompts seen so far are held out: {rule}: {why})"


class DrafterPushing:
    """Mixed into `Harvester`, which sets these in its constructor."""

    cfg: HarvestConfig
    spool: Spool
    drafter: torch.nn.Module  # in training: the candidate
    serving: torch.nn.Module  # a copy of the version the servers have
    version: int
    versions_dir: Path
    push: PushFn | None
    history: list[dict]  # one row per push attempt: version, the verdict's figures, when, pushed
    _lock: threading.RLock  # drafter, optimizer and serving copy
    _serving_scores: dict[int, tuple[float, int]]  # spool seq -> the serving drafter's score
    _pending: tuple[dict, Verdict, str] | None  # a candidate that won inside a step (weights, verdict, why)
    _pushed_this_step: bool
    _since_push: int

    @property
    def gate(self) -> Gate:
        cfg = self.cfg
        return Gate(cfg.min_holdout_prompts, cfg.min_holdout_samples, cfg.min_gain, cfg.mid_step_gain)

    def score(
        self,
        drafter: torch.nn.Module | None = None,
        policy_version: int | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> float | None:
        """Expected acceptance length (`accept_mode`) on held-out windows of `policy_version` (default: the
        newest `holdout_versions`; `pick_holdout`); None as `holdout_sums`. Serving scores cached until a push."""
        with self._lock:
            drafter = drafter or self.drafter
            cache = self._serving_scores if drafter is self.serving else {}
            sums = holdout_sums(drafter, pick_holdout(self.spool, self.cfg, policy_version), self.cfg, cache, stop)
        if sums is None:
            return None
        return sum(s for s, _ in sums) / max(sum(c for _, c in sums), 1)

    def maybe_push(self, stop: Callable[[], bool] | None = None, boundary: bool = True) -> int | None:
        """Push the trained drafter if it beats the serving one on the same held-out samples; the new version
        or None. `boundary`: between steps (starts a step's push budget), else inside one (the idle window: one
        push a step, a winner below `mid_step_gain` waits for `new_step()`). `stop()` abandons the attempt."""
        with self._lock:
            if boundary:
                self._pushed_this_step, self._pending = False, None
            elif self._pushed_this_step:
                return None
            # both on the same samples, whatever is harvested meanwhile
            held = pick_holdout(self.spool, self.cfg)
            candidate = holdout_sums(self.drafter, held, self.cfg, {}, stop)
            serving = holdout_sums(self.serving, held, self.cfg, self._serving_scores, stop)
            if stop is not None and stop() or candidate is None or serving is None:
                return None
            verdict = paired_verdict(candidate, serving, [it.prompt for it in held], self.cfg.confidence_z)
            action, why = self.gate.decide(verdict, boundary)
            row = {
                "version": self.version,
                "when": "boundary" if boundary else "mid_step",
                **(verdict.row() if verdict else {}),
                "why": why + few_prompts_note(self.spool, self.cfg, verdict),
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

    def push_status(self, attempt: dict | None = None) -> str:
        """The gate's last word: `attempt`'s outcome (a `history` row), else how far the next attempt is."""
        return status_line(attempt, self._since_push, self.cfg.push_every)

    def push_failed(self, exc: Exception) -> None:
        """Record a push that raised: the server keeps the old drafter, and RL goes on."""
        self.history.append({"version": self.version, "pushed": False, "error": f"{type(exc).__name__}: {exc}"})

    def new_step(self) -> int | None:
        """The step boundary (starts its push budget): push the best mid-step winner (no rescoring); version or None."""
        with self._lock:
            pending, self._pending, self._pushed_this_step = self._pending, None, False
            if pending is None:
                return None
            drafter = copy.deepcopy(self.serving)
            drafter.load_state_dict(pending[0])
            why = f"won mid-step: {pending[2]}"
            return self._push(drafter, {"version": self.version, "when": "boundary", **pending[1].row(), "why": why})

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

    def _prune(self) -> None:
        for _, path in drafter_versions(self.versions_dir)[: -self.cfg.keep_versions]:
            shutil.rmtree(path, ignore_errors=True)
