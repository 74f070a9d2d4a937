"""The SD controller's cost model (`controller.py`): seconds of a target pass per (running bucket, rows per sequence)
and of a drafter step per running bucket, from real iterations (EMAs) over a small calibration at start."""

from __future__ import annotations

import bisect
import time

import numpy as np
import torch

T_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 33)  # tokens per sequence in a pass (1: plain)
CALIBRATION_BATCHES = (1, 8, 16, 32)


def b_bucket(b: int) -> int:
    """Running-batch bucket: the next power of two."""
    return 1 << max(b - 1, 0).bit_length()


def ema(old: float | None, new: float, alpha: float = 0.2) -> float:
    return new if old is None else old + alpha * (new - old)


class CostModel:
    def __init__(self) -> None:
        self.target: dict[int, dict[int, float]] = {}  # B bucket -> T cell -> seconds
        self.step: dict[int, float] = {}  # B bucket -> drafter seconds per step
        self._calibrated: set[tuple[int, int]] = set()  # cells holding a bare forward's time
        self._drafter_shape: tuple = ()  # of the drafter `step` was timed for

    def record_pass(self, b: int, t: float, seconds: float, calibrating: bool = False) -> None:
        """A decode iteration of b sequences x t tokens (rows per sequence) took `seconds`; a t between cells is
        recorded at the nearest, scaled along the current curve. A calibrated cell (a bare forward) is replaced by its
        first real iteration; a bucket's first real plain iteration rescales its other calibrated cells by the same
        ratio (overheads beyond the forward: pessimistic for SD)."""
        bucket = b_bucket(b)
        i = min(bisect.bisect_left(T_GRID, t), len(T_GRID) - 1)
        if i and t - T_GRID[i - 1] < T_GRID[i] - t:
            i -= 1
        cell = T_GRID[i]
        if cell != t and not calibrating:  # t: rows per sequence, maybe fractional
            est = self.pass_seconds(b)
            at_t = np.interp(t, GRID, est)
            if np.isfinite(est).all() and at_t > 0:
                seconds *= est[i] / at_t
        cells = self.target.setdefault(bucket, {})
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
            cells[cell] = ema(cells.get(cell), seconds)

    def record_draft(self, b: int, steps: int, seconds: float) -> None:
        self.step[b_bucket(b)] = ema(self.step.get(b_bucket(b)), seconds / (steps + 1))

    def pass_seconds(self, b: int) -> np.ndarray:
        """[len(T_GRID)] estimated target seconds for T in T_GRID at batch b (nan: nothing known): b's bucket's cells,
        interpolated; outside their range the nearest other bucket's curve (`calibrate` measured a few) anchored at the
        nearest own cell; without one, proportional to T above."""
        own = self.target.get(b_bucket(b), {})
        others = [x for x in self.target if x != b_bucket(b) and len(self.target[x]) > 1]
        ref = _curve(self.target[min(others, key=lambda x: abs(np.log2(x / b_bucket(b))))]) if others else None
        if not own:
            return ref if ref is not None else np.full(len(T_GRID), np.nan)
        est, ts, secs = _curve(own), sorted(own), [own[t] for t in sorted(own)]
        if ref is not None:
            below, above = GRID < ts[0], GRID > ts[-1]
            i0, i1 = T_GRID.index(ts[0]), T_GRID.index(ts[-1])
            est[below] = secs[0] * ref[below] / ref[i0]
            est[above] = secs[-1] * ref[above] / ref[i1]
        return est

    def draft_seconds(self, b: int, k: int) -> float:
        """A k-step drafter call at batch b (catch-up counted as one step); an unmeasured bucket takes the nearest's."""
        if self.step:
            near = min(self.step, key=lambda x: abs(np.log2(x) - np.log2(b_bucket(b))))
            return self.step[near] * (k + 1)
        known = self.pass_seconds(b)[0]
        return (0.25 * known if np.isfinite(known) else 0.0) * (k + 1)

    @torch.inference_mode()
    def calibrate(
        self,
        runner,
        batches: tuple[int, ...] = CALIBRATION_BATCHES,
        tokens: tuple[int, ...] = (1, 4, 16, 33),
        context: int = 32,
        repeats: int = 2,
    ) -> None:
        """Time target passes of B sequences x T tokens over fresh caches of `context` tokens."""
        device = runner.device
        for b in batches:
            for t in tokens:
                best = float("inf")
                for _ in range(repeats + 1):  # the first run warms up
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
    def calibrate_drafter(self, drafter, batches: tuple[int, ...] = (1, 8, 32), repeats: int = 2) -> None:
        """Time one drafter step (forward + logits) for B sequences; replaces the step estimates, but those of a drafter
        of the same shape (what a step costs depends on), kept across swaps."""
        from gleanrl.server.sd.drafter_forward import drafter_forward, new_draft_cache

        shape = tuple((n, tuple(p.shape), p.dtype) for n, p in drafter.named_parameters())
        if self.step and shape == self._drafter_shape:
            return
        w, self.step, self._drafter_shape = drafter.fc.weight, {}, shape
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


GRID = np.array(T_GRID, dtype=float)


def _curve(cells: dict[int, float]) -> np.ndarray:
    """[len(T_GRID)] one bucket's measured cells interpolated linearly in T, constant below the first, proportional to T
    above the last (pessimistic for SD)."""
    ts = np.array(sorted(cells), dtype=float)
    secs = np.array([cells[t] for t in sorted(cells)])
    est = np.interp(GRID, ts, secs)
    above = GRID > ts[-1]
    est[above] = secs[-1] * GRID[above] / ts[-1]
    return est
