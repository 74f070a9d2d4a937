"""Which drafts to verify this iteration: the cost-model controller. The plan each estimate makes best, and the rate
rule it maximises, are `plan.py`'s (`best_plan`); when a plan plays is this file's.

Adaptive mode plays SD only where it measured to pay (`plan`; what real iterations measured is `cells.py`'s): the best
plan by pessimistic estimates plays when it beats plain and its cell (running bucket, source, depth bucket) measured to
pay, in realised tokens per second of whole iterations (drafter call and catch-up included) against plain's; every
PROBE-th such plan in a row is plain instead, so plain stays measured. A plan whose cell has not measured to pay is a
probe, paid from the bucket's probe credit (a small share of its time, less what probes lost): unmeasured cells first, a
losing one every REPROBE-th refusal, and on a look (every EXPLORE-th plain plan in a row, the span doubling while looks
find nothing) the best plan by exploring estimates when it comes within CLOSE of plain (a chain at most EXPLORE_DEPTHS
past the measured ones; plans by measured estimates go one past). A drafter whose realised acceptance falls below the
break-even floor is dropped for the bucket until a probe re-measures it. While no cell of a bucket pays and no probe is
due or affordable, plain plays without planning.

Estimates (`cost_model.py`, `acceptance.py`; the details in their docstrings): target seconds per (B bucket, rows per
sequence) and drafter seconds per step, EMAs of real iterations over a calibration at start, so every bucket has a curve
to follow (the realised cells, not the model, decide where SD plays); acceptance per draft depth from decayed counts,
with no optimistic prior for EAGLE-3. A drafter swap halves the EAGLE-3 counts and re-opens its cells.
`mode="on"` plays the best plan with a draft wherever one exists, at any batch size (tests); with a fixed k, every
sequence that can takes the EAGLE-3 chain of k (min(k, cap)) and, fused or without a chain, its group draft up to k as a
branch of its own, so the uniforms a seeded request draws do not depend on timing."""

from __future__ import annotations

import numpy as np

from gleanrl.server.config import ControllerConfig
from gleanrl.server.sampling.sequence import Sequence
from gleanrl.server.sd.acceptance import MAX_DEPTH, Acceptance
from gleanrl.server.sd.cells import Cells
from gleanrl.server.sd.cost_model import CALIBRATION_BATCHES, CostModel, b_bucket
from gleanrl.server.sd.plan import Plan, best_plan

PROBE, CLOSE = 16, 0.8  # adaptive: how often the side not played is measured
EXPLORE, QUIET_MAX = 8, 64  # plain plans between looks (the span doubles while they find nothing)


class Controller:
    def __init__(self, config: ControllerConfig | None = None, cost: CostModel | None = None):
        """`cost`: a cost model shared with another controller (a lane of the same decoder)."""
        self.config = config or ControllerConfig()
        self.cost, self.accept, self.cells = cost or CostModel(), Acceptance(), Cells()
        self._streak: dict[int, tuple[bool, int]] = {}  # B bucket -> (plans drafted, iterations in a row)
        self._quiet: dict[int, int | None] = {}  # B bucket -> the evidence version its last plan played plain on
        self._span: dict[int, int] = {}  # B bucket -> plain plans between looks (EXPLORE .. QUIET_MAX)

    def _in_a_row(self, b: int, drafts: bool) -> int:
        """Counts this bucket's plans in a row on one side; returns the count."""
        side, n = self._streak.get(b_bucket(b), (drafts, 0))
        n = n + 1 if side == drafts else 1
        self._streak[b_bucket(b)] = (drafts, n)
        return n

    def still_quiet(self, b: int) -> bool:
        """Plain without planning (counted as a plain plan; the decoder asks before it gathers a plan's inputs) while no
        cell of the bucket pays, the last plan played plain and either no probe is affordable (every drafting plan there
        would be one) or the acceptance evidence has not moved and no look is due. Looks come every EXPLORE-th plain
        plan, the span doubling up to QUIET_MAX while they find nothing to play."""
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
        """caps[s]: most draft tokens s may verify (max_new_tokens, context); group_probs[s]: the estimates of s's group
        draft (empty: none); eagle_ok[s]: s can take an EAGLE-3 chain; keys[s]: s itself, for its own acceptance
        estimates (None: pooled only). Adaptive mode plays by the module docstring's rule."""
        cfg, b = self.config, len(caps)
        on, srcs = cfg.sd == "on", cfg.sd_sources
        group_on = "group" in srcs and (on or b <= cfg.group_max_batch) and any(group_probs)
        eagle_on = "eagle" in srcs and (on or b <= cfg.sd_max_batch) and any(eagle_ok)
        if b == 0 or not (group_on or eagle_on) or (not on and not group_on and self.still_quiet(b)):
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
        caps_a, elig = np.minimum(np.array(caps), MAX_DEPTH), np.array(eagle_ok) & eagle_on
        args = (cfg, self.accept, self.cost, caps_a, group_probs if group_on else None, elig, keys, secs, plain_rate)
        if on:  # draft wherever a draft exists
            return best_plan(*args, explore=True, force=True) or none
        bucket = b_bucket(b)
        best = best_plan(*args, explore=False)
        plays = best is not None and best.expected_rate > plain_rate and self.cells.allowed(b, self.cells.key(b, best))
        self._quiet[bucket] = None if plays else self.accept.version
        if plays:
            self._span[bucket] = EXPLORE
            if self._in_a_row(b, True) < PROBE:
                return best
            self._streak[bucket] = (False, 0)
            return none  # the plain probe
        n = self._in_a_row(b, False)
        if n < EXPLORE and not self.cells.any_pays(bucket):
            return none
        if n >= EXPLORE:
            self._streak[bucket] = (False, 0)  # the next look a span of plans on
        opt = self._explore(b, args, n >= EXPLORE, plain_rate)
        if opt is not None:
            self._quiet[bucket], self._span[bucket] = None, EXPLORE
        elif n >= EXPLORE:  # a look found nothing: look less often
            self._span[bucket] = min(2 * self._span.get(bucket, EXPLORE), QUIET_MAX)
        return opt or none

    def _explore(self, b: int, args: tuple, look: bool, plain_rate: float) -> Plan | None:
        """The best plan by exploring estimates, when its cell pays, or on a look when its cell has not measured to lose
        and a probe is affordable (None: plain)."""
        opt = best_plan(*args, explore=True)
        if opt is None or opt.expected_rate < CLOSE * plain_rate:
            return None
        key = self.cells.key(b, opt)
        if opt.expected_rate > plain_rate and self.cells.pays(key):
            return opt
        return opt if look and not self.cells.loses(key) and self.cells.can_probe(b) else None

    def calibrate(self, runner, batches: tuple[int, ...] = CALIBRATION_BATCHES) -> None:
        """Time bare target passes at `batches` up to the first at or above the largest batch a source may draft at
        (sd on: all): where nothing drafts only plain's cost counts, and real iterations measure it. On the 32-layer
        policy at 1 thread the 32-batch cells took 12 of the 16 s a replica spent calibrating at start (16: 6.5 s)."""
        cfg, srcs = self.config, self.config.sd_sources
        limit = max(cfg.sd_max_batch if "eagle" in srcs else 0, cfg.group_max_batch if "group" in srcs else 0)
        limit = batches[-1] if cfg.sd == "on" else limit
        upto = next((i for i, b in enumerate(batches) if b >= limit), len(batches) - 1)
        self.cost.calibrate(runner, batches[: upto + 1])

    def drafter_swapped(self) -> None:
        self.accept.drafter_swapped()
        self.cells.drafter_swapped()

    def record_iteration(
        self, b: int, plan: Plan, tokens: int, seconds: float, chains: int = 0, accepted: int = 0
    ) -> None:
        """A whole SD iteration of b ready sequences (drafter call included) emitted `tokens`; `chains` EAGLE-3 chains
        were tested, `accepted` of their tokens accepted."""
        self.cells.record(b, plan, tokens, seconds)
        self.cells.record_acceptance(b, chains, accepted, self.accept_floor(b))

    def record_plain(self, b: int, seconds: float) -> None:
        """A whole plain iteration of b decoding sequences: the cost model's T = 1 cell, the bucket's probe credit."""
        self.cost.record_pass(b, 1, seconds)
        self.cells.feed(b_bucket(b), seconds, seconds)

    def accept_floor(self, b: int) -> float:
        """EAGLE-3 tokens accepted per chain at which the cheapest chain (one token) only breaks even at batch b:
        (b + b a) / (target(b, 2) + drafter(b, 1)) = b / target(b, 1). Any longer chain costs more, so below it no
        chain pays (0: costs unknown)."""
        secs = self.cost.pass_seconds(b)
        if not np.isfinite(secs[:2]).all() or secs[0] <= 0:
            return 0.0
        return max(0.0, (secs[1] + self.cost.draft_seconds(b, 1)) / secs[0] - 1)

    def summary(self) -> dict:
        """Measured target pass ms per (B bucket, T) and drafter ms per step; EAGLE-3's acceptance by depth."""
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
