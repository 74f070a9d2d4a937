"""The engine: `Engine` (the only door), its decode thread, scheduler, sequences, sampling, stops.

`from gleanrl.server.engine import Engine` (resolved on first use: the engine's own modules import
each other through this package)."""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from gleanrl.server.engine.engine import Engine
        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
