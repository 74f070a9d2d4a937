"""The engine's one shared state: the request sets, the control flags and the versions; the swap records handed to the
decode thread through it (`swap.py` makes and applies them).

Invariant: every field is read and written under `cv` (one lock for the decode thread and all callers); only the forward
itself runs outside it, with `in_step` set. A sequence is in exactly one of `held`, `waiting`, `running`, or none once
finished (its `status` says which); `rids` names those of all three."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from gleanrl.harvest.drafter import Eagle3Drafter
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.sampling.sequence import Sequence
from gleanrl.server.weights.checkpoint import Signature

PauseMode = Literal["abort", "retract", "in_place"]
PAUSE_MODES: tuple[PauseMode, ...] = ("abort", "retract", "in_place")


@dataclass(eq=False)
class TargetSwap:
    runner: ModelRunner
    config: dict
    signature: Signature
    path: str
    version: str | None  # None keeps the current version (SGLang)
    flush_cache: bool
    drain: bool = True  # wait for the admitted requests; set when handed over
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None  # set when applying failed (undone)


@dataclass(eq=False)
class DraftSwap:
    drafter: Eagle3Drafter  # fused
    path: str
    version: str | None
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


@dataclass(eq=False)
class EngineState:
    cv: threading.Condition = field(default_factory=threading.Condition)
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    held: deque[Sequence] = field(default_factory=deque)  # arrived while a target update drains
    rids: set[str] = field(default_factory=set)
    paused: PauseMode | None = None
    stopping: bool = False
    in_step: bool = False
    swap: TargetSwap | DraftSwap | None = None  # handed to the decode thread
    weight_version: str = "default"
    draft_weight_version: str | None = None
    generation_tokens_total: int = 0
    urgent: bool = False  # a first token or a final update was emitted: deliver without delay
