"""SGLang's /release_memory_occupation and /resume_memory_occupation (`tags`: kv_cache, weights, cuda_graph; none means
all), for co-located RL where the trainer needs the accelerator between rollouts.

As SGLang, a release is refused unless the server is idle, and generation needs everything resumed (here a clear 400
instead of SGLang's undefined behaviour). kv_cache: the slot pool is dropped (and the CUDA cache emptied), then rebuilt
on resume. weights: on the CPU there is no accelerator memory to give back, so the weights stay in place and only the
semantics hold; on CUDA moving them off the device is not implemented and the tag is refused by name. cuda_graph: the
embedded engine captures none. The drafter is never touched, so it survives a release/resume cycle (stock SGLang loses
it, SGLang #31674). Weight updates stay allowed while released (release, train, push, resume)."""

from __future__ import annotations

import torch

from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import EngineState

TAGS = ("kv_cache", "weights", "cuda_graph")


def _tags(tags: list[str] | None) -> list[str]:
    tags = list(tags or TAGS)
    bad = [t for t in tags if t not in TAGS]
    if bad:
        raise ValueError(f"tags: {bad[0]!r} is not one of {list(TAGS)}")
    return tags


class MemoryOccupation:
    def __init__(self, state: EngineState, scheduler: Scheduler, device: str):
        self.state, self.scheduler, self.device = state, scheduler, device
        self.released: set[str] = set()

    def release(self, tags: list[str] | None) -> None:
        tags = _tags(tags)
        if "weights" in tags and self.device == "cuda":
            raise ValueError(
                "tags: releasing 'weights' on CUDA is not implemented by the embedded backend; release 'kv_cache' only"
            )
        st = self.state
        with st.cv:
            if st.running or st.waiting or st.held:
                raise ValueError("release_memory_occupation should be called only when server is idle.")
            if "kv_cache" in tags:
                self.scheduler.release_pool()
            self.released |= set(tags)
        if "kv_cache" in tags and self.device == "cuda":
            torch.cuda.empty_cache()

    def resume(self, tags: list[str] | None) -> None:
        tags = _tags(tags)
        with self.state.cv:
            if "kv_cache" in tags and "kv_cache" in self.released:
                self.scheduler.restore_pool()
            self.released -= set(tags)
