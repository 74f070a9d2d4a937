"""Thread settings per phase of a synchronous RL step: phases never overlap, so each may use the whole machine
(`phase_threads(n, all_cores())` lifts the trainer's pin for the update alone). Hazard: OpenMP workers started in a
phase keep its affinity, but after it they only sleep (torch runs the restored thread count), taking no compute
from the server.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator

import torch

from gleanrl.harvest.idle import Pin


def all_cores() -> set[int]:
    """The cores this machine lets the process run on (the cgroup's, not only this thread's pin)."""
    if not hasattr(os, "sched_getaffinity"):
        return set(range(os.cpu_count() or 1))
    saved = os.sched_getaffinity(0)
    try:
        # the kernel narrows a wider request to the cpuset: ask for everything, read what was granted
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
        return set(os.sched_getaffinity(0))
    finally:
        os.sched_setaffinity(0, saved)


@contextlib.contextmanager
def phase_threads(threads: int, cores: Collection[int] = ()) -> Iterator[None]:
    """torch's thread count (and, given `cores`, the calling thread's affinity) for one phase; both restored."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    pin, saved_threads = Pin(), torch.get_num_threads()
    try:
        if cores:
            pin.to(cores)
        torch.set_num_threads(threads)
        yield
    finally:
        torch.set_num_threads(saved_threads)
        pin.restore()
