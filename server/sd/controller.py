"""Which drafts to verify this iteration: the cost-model controller.

Rule. With B decode-ready sequences, a plan verifies for sequence s a draft tree (nothing, the group
draft's first l_s tokens, the EAGLE-3 chain of k tokens, or both as two branches) in one target pass
of at most T tokens per sequence, after one drafter call of k steps when any sequence uses EAGLE-3.
Its expected rate is

    rate = sum_s (1 + E[accepted_s]) / (target(B, T) + [k > 0] * drafter(B_e, k)),

where E[accepted] of a chain with conditional acceptances a_1.. a_l is sum_j prod_{i<=j} a_i and of
a two-branch tree (group first, then EAGLE-3 on the residual) E_group + (1 - a_group,1) * E_eagle.
Plain decoding is the plan T = 1 (rate B / target(B, 1)). Every iteration plays the plan of highest
expected rate over T in `T_GRID`, k in `K_GRID` (each sequence taking, within T and k, its own best
tree), so SD runs only where its expected rate beats plain decoding's: never slower than plain as
far as the estimates are right, and they are kept right by measuring every iteration. Adaptive mode
plays the losing side now and then (`_plays_draft`): the estimates of a side not played would
otherwise freeze, e.g. one slow plain iteration kept SD on at batch 1 while it ran at 0.72x.

Estimates (`CostModel`, `Acceptance`):
- target(B, T): seconds of a decode iteration but its drafter call (sync, plan, pass, verify,
  bookkeeping) per (B bucket, T cell), an EMA of every iteration; unmeasured cells interpolate
  linearly in T within their B bucket and, outside its measured range, follow the nearest bucket's
  curve anchored at its own cells; `calibrate` times bare forwards on a small grid (B 1, 8, 32 x T
  1, 4, 16, 33) at start, so every bucket has a curve to follow; real iterations replace
  (and rescale) them.
- drafter(B, k): seconds per drafter step (catch-up counted as one) per B bucket, an EMA, timed at
  each drafter load (`calibrate_drafter`); an unmeasured bucket takes the nearest measured one's.
- acceptance: decayed counts (tries, accepted) per source and draft depth, for group drafts also per
  bin of the index's own estimate; priors (the index's estimate, 0.7 for EAGLE-3) weigh 2 tries, so
  a source is tried until measured. A drafter swap halves the EAGLE-3 counts: kept, but new
  measurements soon dominate.
`mode="on"` plays the best plan with a draft wherever one exists, at any batch size (tests); with a
fixed k, every sequence that can takes the EAGLE-3 chain of k (min(k, cap)) and, fused or without a
chain, its group draft up to k as a branch of its own, so the uniforms a seeded request draws do not
depend on timing.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np
import torch

T_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 33)   # tokens per sequence in a pass (1: plain)
K_GRID = (1, 2, 3, 4, 5, 6, 8)                            # EAGLE-3 chain lengths
MAX_DEPTH = 32
PROBE, CLOSE = 16, 0.8                                    # adaptive: how often the side not
                                                          # played is measured
_PROB_BINS = (0.5, 0.7, 0.85, 0.95)                       # group estimate bins: < .5,
                                                          # .5-.7, ... >= .95
_DEPTH_BINS = (1, 2, 4, 8, 16)                            # group depth bins: 1, 2, 3-4,
                                                          # 5-8, 9-16, 17-32


def b_bucket(b: int) -> int:
    """Running-batch bucket: the next power of two."""
    return 1 << max(b - 1, 0).bit_length()


def _ema(old: float | None, new: float, alpha: float = 0.2) -> float:
    return new if old is None else old + alpha * (new - old)


class CostModel:
    def __init__(self) -> None:
        self.target: dict[int, dict[int, float]] = {}       # B bucket -> T cell -> seconds
        self.step: dict[int, float] = {}                    # B bucket -> drafter seconds per step
        self._calibrated: set[tuple[int, int]] = set()      # cells holding a bare forward's time

    def record_pass(self, b: int, t: int, seconds: float, calibrating: bool = False) -> None:
        """A decode iteration of b sequences x t tokens took `seconds`. A calibrated cell (a bare
        forward) is replaced by its first real iteration; a bucket's first real plain iteration
        rescales its other calibrated cells by the same ratio (overheads beyond the forward:
        pessimistic for SD)."""
        bucket = b_bucket(b)
        cells = self.target.setdefault(bucket, {})
        cell = T_GRID[min(bisect.bisect_left(T_GRID, t), len(T_GRID) - 1)]
        if calibrating:
            cells[cell] = seconds
            self._calibrated.add((bucket, cell))
        elif (bucket, cell) in self._calibrated:
            if cell == 1:
                ratio = seconds / cells[1]
                for c in cells:
                    if (bucket, c) in self._calibrated:
                        cells[c] *= ratio
            self._calibrated.discard((bucket, cell))
            cells[cell] = seconds
        else:
            cells[cell] = _ema(cells.get(cell), seconds)

    def record_draft(self, b: int, steps: int, seconds: float) -> None:
        self.step[b_bucket(b)] = _ema(self.step.get(b_bucket(b)), seconds / (steps + 1))

    def pass_seconds(self, b: int) -> np.ndarray:
        """[len(T_GRID)] estimated target seconds for T in T_GRID at batch b (nan: nothing known):
        b's bucket's cells, interpolated; outside their range the nearest other bucket's curve
        (`calibrate` measured a few) anchored at the nearest own cell; without one,
        proportional to T above."""
        own = self.target.get(b_bucket(b), {})
        others = [x for x in self.target if x != b_bucket(b) and len(self.target[x]) > 1]
        ref = _curve(self.target[min(others, key=lambda x: abs(np.log2(x / b_bucket(b))))]) if others else None
        if not own:
            return ref if ref is not None else np.full(len(T_GRID), np.nan)
        est, ts, secs = _curve(own), sorted(own), [own[t] for t in sorted(own)]
        if ref is not None:
            below, above = _GRID < ts[0], _GRID > ts[-1]
            i0, i1 = T_GRID.index(ts[0]), T_GRID.index(ts[-1])
            est[below] = secs[0] * ref[below] / ref[i0]
            est[above] = secs[-1] * ref[above] / ref[i1]
        return est

    def draft_seconds(self, b: int, k: int) -> float:
        if self.step:
            near = min(self.step, key=lambda x: abs(np.log2(x) - np.log2(b_bucket(b))))
            return self.step[near] * (k + 1)
        known = self.pass_seconds(b)[0]
        return (0.25 * known if np.isfinite(known) else 0.0) * (k + 1)

    @torch.inference_mode()
    def calibrate(self, runner, batches: tuple[int, ...] = (1, 8, 32),
                  tokens: tuple[int, ...] = (1, 4, 16, 33),
                  context: int = 32, repeats: int = 2) -> None:
        """Time target passes of B sequences x T tokens over fresh caches of `context` tokens."""
        device = runner.device
        for b in batches:
            for t in tokens:
                best = float("inf")
                for _ in range(repeats + 1):                    # the first run warms up
                    caches = [runner.new_cache(context + t + 1) for _ in range(b)]
                    ids = torch.zeros(b * context, dtype=torch.long, device=device)
                    pos = torch.arange(context, device=device).repeat(b)
                    runner.forward(ids, pos, caches, [context] * b)
                    ids = torch.zeros(b * t, dtype=torch.long, device=device)
                    pos = torch.arange(context, context + t, device=device).repeat(b)
                    t0 = time.perf_counter()
                    runner.forward(ids, pos, caches, [t] * b, last_only=t == 1)
                    best = min(best, time.perf_counter() - t0)
                self.record_pass(b, t, best, calibrating=True)

    @torch.inference_mode()
    def calibrate_drafter(self, drafter, batches: tuple[int, ...] = (1, 8, 32),
                          repeats: int = 2) -> None:
        """Time one drafter step (forward + logits) for B sequences; replaces the step estimates."""
        from gleanrl.server.sd.drafter_forward import drafter_forward, new_draft_cache

        w = drafter.fc.weight
        self.step = {}
        for b in batches:
            best = float("inf")
            for _ in range(repeats + 1):
                caches = [new_draft_cache(drafter) for _ in range(b)]
                ids = torch.zeros(b, dtype=torch.long, device=w.device)
                hidden = torch.zeros(b, w.shape[1], dtype=w.dtype, device=w.device)
                t0 = time.perf_counter()
                drafter.logits(drafter_forward(drafter, ids, hidden, ids, caches, [1] * b))
                best = min(best, time.perf_counter() - t0)
            self.step[b_bucket(b)] = best


_GRID = np.array(T_GRID, dtype=float)


def _curve(cells: dict[int, float]) -> np.ndarray:
    """[len(T_GRID)] one bucket's measured cells interpolated linearly in T, constant below the
    first, proportional to T above the last (pessimistic for SD)."""
    ts = np.array(sorted(cells), dtype=float)
    secs = np.array([cells[t] for t in sorted(cells)])
    est = np.interp(_GRID, ts, secs)
    above = _GRID > ts[-1]
    est[above] = secs[-1] * _GRID[above] / ts[-1]
    return est


@dataclass
class _Counts:
    tries: np.ndarray
    accepted: np.ndarray

    def rate(self, prior: np.ndarray, weight: float = 2.0) -> np.ndarray:
        return (self.accepted + weight * prior) / (self.tries + weight)

    def add(self, index: tuple, accepted: bool, decay: float) -> None:
        self.tries[index] = self.tries[index] * decay + 1
        self.accepted[index] = self.accepted[index] * decay + accepted


class Acceptance:
    """Conditional acceptance per draft depth: EAGLE-3 by depth, group drafts by (depth bin,
    estimate bin)."""

    def __init__(self, decay: float = 0.995):
        self.decay = decay
        self.eagle = _Counts(np.zeros(MAX_DEPTH), np.zeros(MAX_DEPTH))
        shape = (len(_DEPTH_BINS) + 1, len(_PROB_BINS) + 1)
        self.group = _Counts(np.zeros(shape), np.zeros(shape))
        self._group_prior = np.array([[0.4, 0.6, 0.78, 0.9, 0.97]] * shape[0])

    def eagle_rates(self, eagle_prior: float = 0.7) -> np.ndarray:
        """[MAX_DEPTH] conditional acceptance of the EAGLE-3 chain's token j + 1."""
        return self.eagle.rate(np.full(MAX_DEPTH, eagle_prior))

    def group_table(self) -> np.ndarray:
        """[depth bins, estimate bins] conditional acceptance of group draft tokens."""
        return self.group.rate(self._group_prior)

    def record(self, source: str, n_tried: int, n_accepted: int,
               probs: list[float] | None = None) -> None:
        """A branch of n_tried tokens whose first n_accepted were accepted (tokens after the first
        rejection were not tested)."""
        tested = min(n_accepted + 1, n_tried)
        if source == "eagle":
            for j in range(tested):
                self.eagle.add((j,), j < n_accepted, self.decay)
        else:
            d, p = _group_bins(probs[:tested])
            for j in range(tested):
                self.group.add((d[j], p[j]), j < n_accepted, self.decay)

    def drafter_swapped(self) -> None:
        self.eagle.tries *= 0.5
        self.eagle.accepted *= 0.5


# [32] depth bin
_DEPTH_IDX = np.searchsorted(_DEPTH_BINS, np.arange(1, MAX_DEPTH + 1), side="left")


def _group_bins(probs: list[float]) -> tuple[np.ndarray, np.ndarray]:
    return _DEPTH_IDX[:len(probs)], np.searchsorted(_PROB_BINS, probs, side="right")


def expected_accepted(rates: np.ndarray) -> np.ndarray:
    """rates [..., L] conditional acceptances -> [..., L + 1]: expected accepted tokens of the first
    0..L tokens of the chain."""
    cum = np.cumsum(np.cumprod(rates, axis=-1), axis=-1)
    return np.concatenate([np.zeros(rates.shape[:-1] + (1,)), cum], axis=-1)


@dataclass(frozen=True, slots=True)
class Plan:
    group_lens: list[int]           # per sequence: group draft tokens to verify (0: none)
    eagle_lens: list[int]           # per sequence: EAGLE-3 chain tokens to draft and
                                    # verify (0: none)
    expected_rate: float            # tokens per second the plan expects
    plain_rate: float               # and plain decoding

    @property
    def drafts(self) -> bool:
        return any(self.group_lens) or any(self.eagle_lens)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    mode: str = "adaptive"          # on: play the best plan that drafts, wherever one exists
    eagle: bool = True              # EAGLE-3 chains allowed (sources)
    group: bool = True              # group drafts allowed
    fused: bool = True              # both as two branches of one tree
    eagle_max_batch: int = 64       # adaptive: EAGLE-3 only while running <= this
    group_max_batch: int = 64       # adaptive: group drafts only while running <= this
    fixed_k: int | None = None      # a fixed EAGLE-3 chain length

    def __post_init__(self) -> None:
        if self.mode not in ("on", "adaptive"):
            raise ValueError(f"controller mode must be on or adaptive, got {self.mode!r}")
        if self.eagle_max_batch < 1 or self.group_max_batch < 1:
            raise ValueError("max batch limits must be >= 1")
        if self.fixed_k is not None and not 1 <= self.fixed_k <= 16:
            raise ValueError("fixed draft length must be in [1, 16]")


_T = np.array(T_GRID[1:])                                   # [T'] the plans that draft


class Controller:
    def __init__(self, config: ControllerConfig | None = None):
        self.config = config or ControllerConfig()
        self.cost, self.accept = CostModel(), Acceptance()
        self._streak: dict[int, tuple[bool, int]] = {}     # B bucket -> (plans drafted,
                                                           # iterations in a row)

    def _plays_draft(self, b: int, drafts: bool, close: bool) -> bool:
        """Whether this iteration plays the best drafting plan. `drafts`: it beats plain; `close`:
        it comes within CLOSE of plain. Adaptive mode plays the other side now and then, so that the
        cells of a side not played stay measured instead of frozen at one bad sample: plain every
        PROBE-th iteration in a row of drafting (always cheap), a close drafting plan every 4 *
        PROBE-th of plain."""
        side, n = self._streak.get(b_bucket(b), (drafts, 0))
        n = n + 1 if side == drafts else 1
        probe = n >= (PROBE if drafts else 4 * PROBE if close else 1 << 30)
        self._streak[b_bucket(b)] = (drafts, 0 if probe else n)
        return drafts != probe

    def plan(self, caps: list[int], group_probs: list[list[float]], eagle_ok: list[bool]) -> Plan:
        """caps[s]: most draft tokens s may verify (max_new_tokens, context); group_probs[s]: the
        estimates of s's group draft (empty: none); eagle_ok[s]: s can take an EAGLE-3 chain."""
        cfg, b = self.config, len(caps)
        secs = self.cost.pass_seconds(b)                                    # [len(T_GRID)]
        plain_rate = b / secs[0] if b and np.isfinite(secs[0]) and secs[0] > 0 else 0.0
        none = Plan([0] * b, [0] * b, plain_rate, plain_rate)
        on = cfg.mode == "on"
        group_on = cfg.group and (on or b <= cfg.group_max_batch) and any(group_probs)
        eagle_on = cfg.eagle and (on or b <= cfg.eagle_max_batch) and any(eagle_ok)
        if b == 0 or not (group_on or eagle_on):
            return none
        if on and cfg.fixed_k:                       # deterministic: a seed reproduces its sample
            caps_k = [min(c, cfg.fixed_k) for c in caps]
            eagle_lens = [c if ok and eagle_on else 0 for c, ok in zip(caps_k, eagle_ok)]
            group_lens = [min(c, len(p)) if group_on and (cfg.fused or not e) else 0
                          for c, e, p in zip(caps_k, eagle_lens, group_probs)]
            return Plan(group_lens, eagle_lens, plain_rate, plain_rate)
        if not np.isfinite(secs).all():
            return none
        caps_a = np.minimum(np.array(caps), MAX_DEPTH)                      # [B]
        glen = np.array([len(p) for p in group_probs]) if group_on else np.zeros(b, dtype=int)
        g_exp, g_first = self._group_expected(group_probs, np.minimum(glen, caps_a)) if group_on else \
            (np.zeros((b, MAX_DEPTH + 1)), np.zeros(b))                    # [B, 33], [B]
        e_exp = expected_accepted(self.accept.eagle_rates())                # [33]
        elig = np.array(eagle_ok) & eagle_on                                # [B]
        ks = ([cfg.fixed_k] if cfg.fixed_k else list(K_GRID)) if eagle_on else []
        # [T', B] draft tokens allowed
        room = np.minimum(caps_a[None], _T[:, None] - 1)
        rows = np.arange(b)[None]
        g = g_exp[rows, room]                                               # [T', B]
        best, best_rate = None, -1.0                 # the best plan that drafts,
                                                     # whatever plain's rate
        for k in [0] + ks:
            e = np.where(elig, e_exp[np.minimum(room, k)], 0.0)             # [T', B]
            f = np.zeros_like(g)
            if k and cfg.fused and group_on:
                f_room = np.maximum(room - k, 0)
                f = np.where(elig & (f_room > 0),
                             g_exp[rows, f_room] + (1 - g_first) * e_exp[k], 0.0)
            value = np.maximum(np.maximum(g, e if cfg.eagle else 0.0), f)   # [T', B]
            if not value.any():
                continue
            rates = (b + value.sum(1)) / (secs[1:] + (self.cost.draft_seconds(int(elig.sum()), k)
                                                      if k else 0.0))
            ti = int(rates.argmax())
            if value[ti].any() and rates[ti] > best_rate:
                best_rate, best = float(rates[ti]), (k, room[ti], g[ti], e[ti], f[ti])
        if best is not None and not on and not self._plays_draft(b, best_rate > plain_rate,
                                                                 best_rate >= CLOSE * plain_rate):
            best = None                              # plain: it wins, or it is this
                                                     # iteration's probe
        if best is None:
            return none
        k, room, g, e, f = best
        use_f = (f > 0) & (f >= g) & (f >= e)
        use_e = ~use_f & (e > 0) & (e > g)
        use_g = ~use_f & ~use_e & (g > 0)
        group_lens = np.where(use_f, np.minimum(room - k, glen),
                              np.where(use_g, np.minimum(room, glen), 0))
        eagle_lens = np.where(use_f, k, np.where(use_e, np.minimum(room, k), 0))
        return Plan(group_lens.tolist(), eagle_lens.tolist(), best_rate, plain_rate)

    def _group_expected(self, group_probs: list[list[float]],
                        lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expected accepted tokens [B, 33] of each group draft's first 0..32 tokens (flat beyond
        its usable length lens[s]), and its first token's acceptance [B]."""
        b = len(group_probs)
        probs = np.zeros((b, MAX_DEPTH))
        for s, p in enumerate(group_probs):
            probs[s, :min(len(p), MAX_DEPTH)] = p[:MAX_DEPTH]
        rates = self.accept.group_table()[_DEPTH_IDX[None],
                                          np.searchsorted(_PROB_BINS, probs, side="right")]
        rates = np.where(np.arange(MAX_DEPTH)[None] < lens[:, None], rates, 0.0)      # [B, 32]
        return expected_accepted(rates), rates[:, 0]

    def drafter_swapped(self) -> None:
        self.accept.drafter_swapped()

    def summary(self) -> dict:
        """Measured target pass seconds per (B bucket, T) and drafter seconds per step, in ms;
        EAGLE-3's acceptance by depth."""
        return {"target_ms": {b: {t: round(1e3 * s, 2) for t, s in sorted(c.items())}
                              for b, c in sorted(self.cost.target.items())},
                "drafter_step_ms": {b: round(1e3 * s, 2)
                                    for b, s in sorted(self.cost.step.items())},
                "eagle_accept": [round(float(x), 3) for x in self.accept.eagle_rates()[:8]]}
