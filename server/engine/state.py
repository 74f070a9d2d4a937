"""The engine's one shared state: the request sets, the control flags and the versions.

Invariant: every field is read and written under `cv` (one lock for the decode thread and all
callers); only the forward itself runs outside it, with `in_step` set. A sequence is in exactly one
of `held`, `waiting`, `running`, or none once finished; `rids` names those of all three.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from gleanrl.server.engine.sequence import Sequence

if TYPE_CHECKING:
    from gleanrl.server.weights.swap import DraftSwap, TargetSwap

PauseMode = Literal["abort", "retract", "in_place"]
PAUSE_MODES: tuple[PauseMode, ...] = ("abort", "retract", "in_place")


@dataclass(eq=False)
class EngineState:
    cv: threading.Condition = field(default_factory=threading.Condition)
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    held: deque[Sequence] = field(default_factory=deque)   # arrived while a target update drains
    rids: set[str] = field(default_factory=set)
    paused: PauseMode | None = None
    stopping: bool = False
    in_step: bool = False
    swap: TargetSwap | DraftSwap | None = None              # handed to the decode thread
    weight_version: str = "default"
    draft_weight_version: str | None = None
    generation_tokens_total: int = 0
    urgent: bool = False  # a first token or a final update was emitted: deliver without delay
