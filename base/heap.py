"""`freeze_heap`: for a long-lived server process, after its startup."""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Move what is alive after startup (torch, transformers, the model: ~350k objects even for a tiny one) out of the
    garbage collector's reach. Otherwise a request that allocates much (a large body, megabytes of logprobs) sets off
    full collections that walk all of it, ~200 ms with every thread stopped: the event loop, /health and the engine
    stall for every client. Process-wide, so only a server's own entry point calls it (`gleanrl serve`, `gleanrl
    proxy`), never a library function such as `build_app`."""
    gc.collect()
    gc.freeze()
