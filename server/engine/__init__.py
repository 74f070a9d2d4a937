"""The engine: `Engine` (the only door: nothing outside this package imports its other modules),
its decode thread, scheduler, state and weight swaps."""

from gleanrl.server.engine.engine import Engine
from gleanrl.server.engine.state import PAUSE_MODES, PauseMode

__all__ = ["Engine", "PAUSE_MODES", "PauseMode"]
