"""The engine: `Engine` (the only door: nothing outside this package imports its other modules), or `EngineProcess`
(the same methods, the engine in a child process), its decode thread, scheduler, state and weight swaps."""

from gleanrl.server.engine.engine import Engine
from gleanrl.server.engine.remote import EngineGone, EngineProcess
from gleanrl.server.engine.state import PAUSE_MODES, PauseMode

__all__ = ["Engine", "EngineGone", "EngineProcess", "PAUSE_MODES", "PauseMode"]
