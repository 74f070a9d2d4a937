"""What the routes read of the app (`app.state`): set once, by `build_app` (`AppState`; the proxy sets
`native.feed.FeedState`, which it extends); every field typed, none added later."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gleanrl.server.http.config import ServerConfig
from gleanrl.server.http.metrics import Metrics
from gleanrl.server.http.native.feed import FeedState

if TYPE_CHECKING:
    from gleanrl.server.engine import Engine
    from gleanrl.server.http.native.weights_sync import Session


@dataclass(slots=True)
class AppState(FeedState):
    engine: Engine
    server_cfg: ServerConfig
    tokenizer: Any  # the engine's (transformers)
    context_length: int
    vocab_size: int
    stop_token_ids: list[int] | None
    version: str  # gleanrl's
    engine_args: dict  # /server_info
    server_args: dict  # /server_info, without the keys
    served_model_name: str
    metrics: Metrics = field(default_factory=Metrics)
    active: dict[str, list[str]] = field(default_factory=dict)  # rid -> its engine rids
    weights_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closing: bool = False  # the lifespan is shutting down
    weight_session: Session | None = None  # an open weight-update session (native/weights_sync.py)
    weight_groups: dict = field(default_factory=dict)  # joined process groups (native/weights_group.py)
    group_joining: asyncio.Lock = field(default_factory=asyncio.Lock)
    grammar_compiler: Any = None  # xgrammar's, built at first use (generate/grammar.py)
