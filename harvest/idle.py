"""Idle-window runner: micro-steps of drafter training that run only while the RL step waits on rollouts.

`waiting` (a callable, or a `threading.Event`) is checked before each micro-step: once closed, at most the running one
finishes, all the update ever waits. `run_window` runs in the caller's thread, `IdleWindow` in a background one (torch
releases the GIL). `cores` (a `CoreGate`) runs only on compute the rollouts left: before each micro-step it asks which
cores are free (e.g. a replica's with nothing left while another decodes its tail), pins the thread there and waits
while none is. `nice` (per thread on Linux) cannot help with shared hardware: on 2 vCPUs, training on the other core
still slows memory-bound decoding (32 rollouts 4.5-5.3 s alone, 6.6-7.7 s beside training at nice 19; 7-8 -> 12 s at
normal priority).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

Waiting = threading.Event | Callable[[], bool]
CoreGate = Callable[[], Collection[int] | None]  # the cores free now; None or empty: none
GATE_POLL_S = 0.005  # how often a gated window looks for a free core


@dataclass(slots=True)
class IdleReport:
    steps: int = 0  # micro-steps completed
    busy_s: float = 0.0  # time spent inside micro-steps (idle time used)
    window_s: float = 0.0  # time the window was open
    overrun_s: float = 0.0  # time the last micro-step ran past the window's close
    free_s: float = 0.0  # gated: time a core was free (the compute the rollouts left)

    def merge(self, other: IdleReport) -> IdleReport:
        return IdleReport(
            self.steps + other.steps,
            self.busy_s + other.busy_s,
            self.window_s + other.window_s,
            max(self.overrun_s, other.overrun_s),
            self.free_s + other.free_s,
        )


def _is_open(waiting: Waiting) -> bool:
    return waiting.is_set() if isinstance(waiting, threading.Event) else bool(waiting())


def run_window(
    step: Callable[[], object], waiting: Waiting, max_steps: int | None = None, cores: CoreGate | None = None
) -> IdleReport:
    """Call `step()` while `waiting` is open (up to `max_steps` that did work); with `cores`, pinned to a free
    core (affinity restored on return). A step returning False had nothing to do: not counted, not busy."""
    report, start = IdleReport(), time.perf_counter()
    pin = Pin() if cores is not None else None
    try:
        while (max_steps is None or report.steps < max_steps) and _is_open(waiting):
            t0 = time.perf_counter()
            if pin is not None:
                if not (free := cores()):
                    time.sleep(GATE_POLL_S)  # every core is decoding: the rollouts keep them
                    continue
                pin.to(free)
            did = step() is not False
            t1 = time.perf_counter()
            report.free_s += (t1 - t0) if pin is not None else 0.0
            if not did:
                continue
            report.steps += 1
            report.busy_s += t1 - t0
            if not _is_open(waiting):  # closed during this step: the overrun the update may see
                report.overrun_s = t1 - t0
    finally:
        if pin is not None:
            pin.restore()
    report.window_s = time.perf_counter() - start
    return report


class Pin:
    """The calling thread's CPU affinity (`sched_setaffinity(0)` is per thread on Linux), changed only when the
    cores differ, restored by `restore()`; a no-op without OS support."""

    def __init__(self):
        self._can = hasattr(os, "sched_setaffinity")
        self._saved = os.sched_getaffinity(0) if self._can else None
        self._now = self._saved

    def to(self, cores: Collection[int]) -> None:
        cores = set(cores)
        if self._can and cores != self._now:
            os.sched_setaffinity(0, cores)
            self._now = cores

    def restore(self) -> None:
        if self._can and self._now != self._saved:
            os.sched_setaffinity(0, self._saved)
            self._now = self._saved


class IdleWindow:
    """Background-thread idle window. `close()` returns the report after at most one micro-step."""

    def __init__(
        self,
        step: Callable[[], object],
        max_steps: int | None = None,
        name: str = "gleanrl-idle",
        nice: int = 0,
        cores: CoreGate | None = None,
    ):
        self._open = threading.Event()
        self._open.set()
        self._step, self._max_steps = step, max_steps
        self.report = IdleReport()  # complete once closed
        self._error: BaseException | None = None
        self._closed_at = 0.0
        self._nice, self._cores = nice, cores
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        if self._nice and hasattr(os, "setpriority"):
            try:  # this thread only (Linux); lowering priority needs no privilege
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._nice)
            except OSError:
                pass
        try:
            self.report = run_window(self._step, self._open, self._max_steps, self._cores)
        except BaseException as exc:  # surfaced by close(), never lost in the thread
            self._error = exc

    def open(self) -> IdleWindow:
        self._thread.start()
        return self

    def close(self) -> IdleReport:
        self._closed_at = time.perf_counter()
        self._open.clear()
        self._thread.join()
        self.report.overrun_s = max(0.0, time.perf_counter() - self._closed_at)
        if self._error is not None:
            raise RuntimeError(f"drafter training failed in the idle window: {self._error}") from self._error
        return self.report

    def __enter__(self) -> IdleWindow:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def busy_step(size: int = 384, chain: int = 8) -> Callable[[], bool]:
    """A micro-step of the drafter's kind of compute (dense float32 matmuls) for a scheduling check."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen) / size

    def step() -> bool:
        x = a
        for _ in range(chain):
            x = x @ b
        return True

    return step
