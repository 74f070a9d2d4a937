"""Which drafts to verify this iteration: the cost-model controller.

Rule. With B decode-ready sequences, a plan verifies for each sequence s its own draft tree
(nothing, the group draft's first tokens, an EAGLE-3 chain of up to k tokens, or both as two
branches) of l_s draft tokens, in one target pass of N = B + sum_s l_s rows, after one drafter call
of k steps when any sequence takes a chain. Its expected rate is

    rate = (B + sum_s E[accepted_s]) / (target(B, N / B) + [any chain] * drafter(B_e, k)),

where E[accepted] of a chain with conditional acceptances a_1.. a_l is sum_j prod_{i<=j} a_i and of
a two-branch tree (group first, then EAGLE-3 on the residual) E_group + (1 - a_group,1) * E_eagle.
For each k in `K_GRID` (and 0: group drafts only) the per-sequence lengths come from Dinkelbach's
iteration on that ratio: each sequence takes the l_s maximising E[accepted_s(l)] - rate * (target
seconds per row) * l, so a sequence whose drafts do not pay for their rows takes none, one that is
accepted often takes a long one. Plain decoding is N = B (rate B / target(B, 1)).

Adaptive mode plays SD only where it measured to pay (`plan`; what real iterations measured is
`cells.py`'s): the best plan by pessimistic estimates plays when it beats plain and its cell (running
bucket, source, depth bucket) measured to pay, in realised tokens per second of whole iterations
(drafter call and catch-up included) against plain's; every PROBE-th such plan in a row is plain
instead, so plain stays measured. A plan whose cell has not measured to pay is a probe, paid from
the bucket's probe credit (a small share of its time, less what probes lost): unmeasured cells
first, a losing one every REPROBE-th refusal, and on a look (every EXPLORE-th plain plan in a row,
the span doubling while looks find nothing) the best plan by exploring estimates when it comes
within CLOSE of plain (a chain at most one depth past the measured ones). A drafter whose realised
acceptance falls below the break-even floor is dropped for the bucket until a probe re-measures it.
While no cell of a bucket pays and no probe is due or affordable, plain plays without planning.

Estimates (`CostModel`, `Acceptance`):
- target(B, t): seconds of a decode iteration but its drafter call (sync, plan, pass, verify,
  bookkeeping) per (B bucket, rows per sequence t in `T_GRID`), an EMA of every iteration (a t
  between cells recorded at the nearest, scaled along the curve); unmeasured cells interpolate
  linearly in t within their B bucket and, outside its measured range, follow the nearest bucket's
  curve anchored at its own cells; `calibrate` times bare forwards on a small grid (B 1, 8, 32 x T
  1, 4, 16, 33) at start, so every bucket has a curve to follow; real iterations replace (and
  rescale) them, and the realised cells, not the model, decide where SD plays.
- drafter(B, k): seconds per drafter step (catch-up counted as one) per B bucket, an EMA, timed at
  the first drafter load (`calibrate_drafter`; kept across swaps of a drafter of the same shape);
  an unmeasured bucket takes the nearest measured one's.
- acceptance: decayed counts (tries, accepted) per draft depth, EAGLE-3 pooled and per sequence
  (shrunk to the pooled rate), group drafts per (depth bin, bin of the index's own estimate) with
  the index's estimate as prior. EAGLE-3 has no optimistic prior: an unmeasured first depth counts
  as rejected, a deeper one starts from DEEPER x the depth before it. A drafter swap halves the
  EAGLE-3 counts and re-opens its cells: kept as a prior, soon dominated by new measurements.
`mode="on"` plays the best plan with a draft wherever one exists, at any batch size (tests); with a
fixed k, every sequence that can takes the EAGLE-3 chain of k (min(k, cap)) and, fused or without a
chain, its group draft up to k as a branch of its own, so the uniforms a seeded request draws do not
depend on timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gleanrl.server.config import ControllerConfig
from gleanrl.server.sampling.sequence import Sequence
from gleanrl.server.sd.acceptance import MAX_DEPTH, Acceptance, expected_accepted
from gleanrl.server.sd.cells import MIN_SAMPLES, REPROBE, Cells
from gleanrl.server.sd.cost_model import GRID, T_GRID, CostModel, b_bucket

__all__ = [
    "MAX_DEPTH",
    "MIN_SAMPLES",
    "REPROBE",
    "T_GRID",
    "Cells",
    "Controller",
    "ControllerConfig",
    "CostModel",
    "Plan",
    "b_bucket",
    "expected_accepted",
]

K_GRID = (1, 2, 3, 4, 5, 6, 8)  # EAGLE-3 chain lengths
# adaptive: how often the side not played is measured
PROBE, CLOSE = 16, 0.8
# plain plans between looks (the span doubles while they find nothing)
EXPLORE, QUIET_MAX = 8, 64


@dataclass(frozen=True, slots=True)
class Plan:
    group_lens: list[int]  # per sequence: group draft tokens to verify (0: none)
    # per sequence: EAGLE-3 chain tokens to draft and verify (0: none)
    eagle_lens: list[int]
    expected_rate: float  # tokens per second the plan expects
    plain_rate: float  # and plain decoding

    @property
    def drafts(self) -> bool:
        return any(self.group_lens) or any(self.eagle_lens)


class Controller:
    def __init__(self, config: ControllerConfig | None = None):
        self.config = config or ControllerConfig()
        self.cost, self.accept, self.cells = CostModel(), Acceptance(), Cells()
        # B bucket -> (plans drafted, iterations in a row)
        self._streak: dict[int, tuple[bool, int]] = {}
        # B bucket -> the evidence version its last plan played plain on
        self._quiet: dict[int, int | None] = {}
        # B bucket -> plain plans between looks (EXPLORE .. QUIET_MAX)
        self._span: dict[int, int] = {}

    def _in_a_row(self, b: int, drafts: bool) -> int:
        """Counts this bucket's plans in a row on one side; returns the count."""
        side, n = self._streak.get(b_bucket(b), (drafts, 0))
        n = n + 1 if side == drafts else 1
        self._streak[b_bucket(b)] = (drafts, n)
        return n

    def _reset(self, b: int) -> None:
        self._streak[b_bucket(b)] = (False, 0)

    def still_quiet(self, b: int) -> bool:
        """Plain without planning (counted as a plain plan; the decoder asks before it gathers a
        plan's inputs) while no cell of the bucket pays, the last plan played plain and either no
        probe is affordable (every drafting plan there would be one) or the acceptance evidence
        has not moved and no look is due. Looks come every EXPLORE-th plain plan, the span
        doubling up to QUIET_MAX while they find nothing to play."""
        bucket = b_bucket(b)
        side, n = self._streak.get(bucket, (True, 0))
        if side or bucket not in self._quiet or self.cells.any_pays(bucket):
            return False
        if self.cells.can_probe(b) and (
            self._quiet[bucket] != self.accept.version or n + 1 >= self._span.get(bucket, EXPLORE)
        ):
            return False
        self._in_a_row(b, False)
        return True

    def plan(
        self, caps: list[int], group_probs: list[list[float]], eagle_ok: list[bool], keys: list[Sequence] | None = None
    ) -> Plan:
        """caps[s]: most draft tokens s may verify (max_new_tokens, context); group_probs[s]: the
        estimates of s's group draft (empty: none); eagle_ok[s]: s can take an EAGLE-3 chain;
        keys[s]: s itself, for its own acceptance estimates (None: pooled only).

        Adaptive: the best plan by pessimistic estimates plays when it beats plain and its cell has
        not measured to lose (every PROBE-th in a row plain instead, to keep plain measured);
        otherwise the best plan by exploring estimates plays when its cell measured to pay, or,
        every EXPLORE-th plain plan in a row, when it comes within CLOSE of plain (cheap
        exploration)."""
        cfg, b = self.config, len(caps)
        on, srcs = cfg.sd == "on", cfg.sd_sources
        group_on = "group" in srcs and (on or b <= cfg.group_max_batch) and any(group_probs)
        eagle_on = "eagle" in srcs and (on or b <= cfg.sd_max_batch) and any(eagle_ok)
        if b == 0 or not (group_on or eagle_on):
            return Plan([0] * b, [0] * b, 0.0, 0.0)
        if not on and not group_on and self.still_quiet(b):
            return Plan([0] * b, [0] * b, 0.0, 0.0)  # no estimates needed
        secs = self.cost.pass_seconds(b)  # [len(T_GRID)]
        plain_rate = b / secs[0] if np.isfinite(secs[0]) and secs[0] > 0 else 0.0
        none = Plan([0] * b, [0] * b, plain_rate, plain_rate)
        if on and cfg.num_draft_tokens:  # deterministic: a seed reproduces its sample
            caps_k = [min(c, cfg.num_draft_tokens) for c in caps]
            eagle_lens = [c if ok and eagle_on else 0 for c, ok in zip(caps_k, eagle_ok)]
            group_lens = [
                min(c, len(p)) if group_on and ("fused" in srcs or not e) else 0
                for c, e, p in zip(caps_k, eagle_lens, group_probs)
            ]
            return Plan(group_lens, eagle_lens, plain_rate, plain_rate)
        if not np.isfinite(secs).all():
            return none
        args = (
            np.minimum(np.array(caps), MAX_DEPTH),
            group_probs if group_on else None,
            np.array(eagle_ok) & eagle_on,
            keys,
            secs,
            plain_rate,
        )
        if on:  # draft wherever a draft exists
            return self._best(*args, explore=True, force=True) or none
        bucket = b_bucket(b)
        best = self._best(*args, explore=False)
        plays = best is not None and best.expected_rate > plain_rate and self.cells.allowed(b, self.cells.key(b, best))
        self._quiet[bucket] = None if plays else self.accept.version
        if plays:
            self._span[bucket] = EXPLORE
            if self._in_a_row(b, True) < PROBE:
                return best
            self._reset(b)
            return none  # the plain probe
        n = self._in_a_row(b, False)
        if n < EXPLORE and not self.cells.any_pays(bucket):
            return none
        if n >= EXPLORE:
            self._reset(b)  # the next look a span of plans on
        opt = self._explore(b, args, n >= EXPLORE, plain_rate)
        if opt is not None:
            self._quiet[bucket], self._span[bucket] = None, EXPLORE
        elif n >= EXPLORE:  # a look found nothing: look less often
            self._span[bucket] = min(2 * self._span.get(bucket, EXPLORE), QUIET_MAX)
        return opt or none

    def _explore(self, b: int, args: tuple, look: bool, plain_rate: float) -> Plan | None:
        """The best plan by exploring estimates, when its cell pays, or on a look when its cell
        has not measured to lose and a probe is affordable (None: plain)."""
        opt = self._best(*args, explore=True)
        if opt is None or opt.expected_rate < CLOSE * plain_rate:
            return None
        key = self.cells.key(b, opt)
        if opt.expected_rate > plain_rate and self.cells.pays(key):
            return opt
        return opt if look and not self.cells.loses(key) and self.cells.can_probe(b) else None

    def _best(
        self,
        caps: np.ndarray,
        group_probs: list[list[float]] | None,
        elig: np.ndarray,
        keys: list[Sequence] | None,
        secs: np.ndarray,
        plain_rate: float,
        explore: bool,
        force: bool = False,
    ) -> Plan | None:
        """The plan of highest expected rate that drafts (None: none does), each sequence its own
        tree and length: for each chain length k, Dinkelbach's iteration on the rate
        (B + sum_s V_s(l_s)) / (target(B + sum_s l_s rows) + drafter(k)): each sequence takes the
        l_s maximising V_s(l) - rate * (seconds per row) * l, so a sequence whose drafts do not pay
        for their rows takes none. `force` (mode on): every sequence that can takes its most
        valuable tree within k, whatever its rows cost."""
        cfg, b = self.config, len(caps)
        rows = np.arange(b)
        k = cfg.num_draft_tokens
        ks = ([k] if k else list(K_GRID)) if elig.any() and "eagle" in cfg.sd_sources else []
        if not force:  # no deeper than one past what is measured
            deepest = self.accept.measured_depths() + 1
            ks = [k for k in ks if k <= deepest]
        if group_probs is not None:
            glen = np.minimum(np.array([len(p) for p in group_probs]), caps)
            g_exp, g_first = self.accept.group_expected(group_probs, glen)  # [B, 33], [B]
        else:
            glen, g_exp, g_first = np.zeros(b, dtype=int), np.zeros((b, MAX_DEPTH + 1)), np.zeros(b)
        # l = 0 .. longest usable tree (L + 1 <= 33 columns)
        ls = np.arange(1 + min(int(caps.max()), (max(ks) if ks else 0) + int(glen.max())))[None]
        fits = ls <= caps[:, None]  # [B, L + 1]
        g_use = np.minimum(ls, glen[:, None])  # [B, L + 1]
        g_val = g_exp[rows[:, None], g_use]
        keys = keys if keys is not None else []
        e_exp = expected_accepted(
            self.accept.seq_eagle_rates(keys, explore) if keys else self.accept.eagle_rates(explore)[None].repeat(b, 0)
        )
        # every chain length at once: [K, B, L + 1] over (k, sequence, draft tokens l)
        kk = np.array([0] + ks)[:, None, None]  # [K, 1, 1]
        r3, on3 = rows[None, :, None], elig[None, :, None] & (kk > 0)
        e_use = np.minimum(ls[None], kk)  # [K, 1, L + 1]
        e_val = np.where(on3, e_exp[r3, e_use], 0.0)  # [K, B, L + 1]
        val = np.maximum(g_val[None], e_val)
        use = np.where(e_val > g_val[None], e_use, g_use[None])
        kind = (e_val > g_val[None]).astype(int)  # 0 group, 1 chain
        if "fused" in cfg.sd_sources and group_probs is not None and ks:
            f_g = np.minimum(np.maximum(ls[None] - kk, 0), glen[None, :, None])  # [K, B, L+1]
            f_val = np.where(
                on3 & (f_g > 0),
                g_exp[r3, f_g] + (1 - g_first[None, :, None]) * e_exp[rows[None], kk[:, :, 0]][:, :, None],
                0.0,
            )
            better = f_val > val
            val, use, kind = np.where(better, f_val, val), np.where(better, kk + f_g, use), np.where(better, 2, kind)
        val, use = np.where(fits[None], val, 0.0), np.where(fits[None], use, 0)
        if force:
            val = np.where(use > 0, val, -np.inf)
        step = self.cost.draft_seconds(int(elig.sum()), 0) if ks else 0.0
        draft_s = step * (kk[:, 0, 0] + 1) * (kk[:, 0, 0] > 0)  # [K]
        # target seconds of a pass of b + j rows, j = 0 .. 33 b
        cost = np.interp((b + np.arange(33 * b + 1)) / b, GRID, secs)
        rate, n = np.full(len(kk), plain_rate), np.zeros(len(kk), dtype=int)  # n: draft rows
        k_idx = np.arange(len(kk))[:, None]
        kind = np.broadcast_to(kind, val.shape)
        best, best_rate = None, -1.0
        for _ in range(3):  # Dinkelbach's iteration, every k at once
            price = rate * (cost[np.minimum(n + b, 33 * b)] - cost[n]) / b  # [K] per row
            if force:  # mode on: each its most valuable tree
                price[:] = 0.0
            pick = (val - price[:, None, None] * use).argmax(2)  # [K, B]
            at = (k_idx, rows[None], pick)
            v, u, kd = val[at], use[at], kind[at]  # [K, B] each
            n = u.sum(1)
            chain = ((kd > 0) & (u > 0)).any(1)
            new = np.where(
                u.any(1),
                (b + np.where(np.isfinite(v), v, 0).sum(1))
                / (cost[np.minimum(n, 33 * b)] + np.where(chain, draft_s, 0.0)),
                -1.0,
            )
            i = int(new.argmax())
            if new[i] > best_rate:
                k = int(kk[i, 0, 0])
                eagle_lens = np.where(kd[i] == 1, u[i], np.where(kd[i] == 2, k, 0))
                best_rate = float(new[i])
                best = Plan((u[i] - eagle_lens).tolist(), eagle_lens.tolist(), best_rate, plain_rate)
            rate = np.where(new > 0, new, rate)
        return best

    def drafter_swapped(self) -> None:
        self.accept.drafter_swapped()
        self.cells.drafter_swapped()

    def record_iteration(
        self, b: int, plan: Plan, tokens: int, seconds: float, chains: int = 0, accepted: int = 0
    ) -> None:
        """A whole SD iteration of b ready sequences (drafter call included) emitted `tokens`;
        `chains` EAGLE-3 chains were tested, `accepted` of their tokens accepted."""
        self.cells.record(b, plan, tokens, seconds)
        self.cells.record_acceptance(b, chains, accepted, self.accept_floor(b))

    def record_plain(self, b: int, seconds: float) -> None:
        """A whole plain iteration of b decoding sequences: the cost model's T = 1 cell, and the
        bucket's probe credit."""
        self.cost.record_pass(b, 1, seconds)
        self.cells.feed(b_bucket(b), seconds, seconds)

    def accept_floor(self, b: int) -> float:
        """EAGLE-3 tokens accepted per chain at which the cheapest chain (one token) only breaks
        even at batch b: (b + b a) / (target(b, 2) + drafter(b, 1)) = b / target(b, 1). Any
        longer chain costs more, so below it no chain pays (0: costs unknown)."""
        secs = self.cost.pass_seconds(b)
        if not np.isfinite(secs[:2]).all() or secs[0] <= 0:
            return 0.0
        return max(0.0, (secs[1] + self.cost.draft_seconds(b, 1)) / secs[0] - 1)

    def summary(self) -> dict:
        """Measured target pass seconds per (B bucket, T) and drafter seconds per step, in ms;
        EAGLE-3's acceptance by depth."""
        return {
            "target_ms": {
                b: {t: round(1e3 * s, 2) for t, s in sorted(c.items())} for b, c in sorted(self.cost.target.items())
            },
            "drafter_step_ms": {b: round(1e3 * s, 2) for b, s in sorted(self.cost.step.items())},
            "eagle_accept": [round(float(x), 3) for x in self.accept.eagle_rates()[:8]],
            "cells": {
                "/".join(map(str, k)): {"samples": c[0], "speedup": round(c[1], 3)}
                for k, c in sorted(self.cells.cells.items())
            },
        }
