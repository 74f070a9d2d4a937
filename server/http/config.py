"""The HTTP server's configuration: a small dataclass validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from gleanrl.server.config import is_loopback
from gleanrl.server.http.reasoning import PARSERS
from gleanrl.server.http.tool_parser import FORMATS


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None  # guards everything but /health
    admin_api_key: str | None = None  # guards weight updates, pause/continue and flush
    # the name in /v1/models (default: the model directory's name)
    served_model_name: str | None = None
    max_request_bytes: int = 8 * 1024 * 1024
    max_n: int = 64
    # None: only the context length limits max_new_tokens (SGLang)
    max_new_tokens_cap: int | None = None
    # engine requests (prompts x n) one HTTP request may start
    max_batch: int = 1024
    # gleanrl extension: GET /harvest_feed (admin key), http/harvest_feed.py
    harvest_feed: bool = False
    # finished requests the feed holds (oldest dropped and counted)
    harvest_feed_records: int = 4096
    # engine requests waiting for a slot; beyond: 503 with Retry-After
    max_queued_requests: int = 8192
    # top_logprobs_num (and OpenAI's logprobs / top_logprobs) per request
    max_top_logprobs_num: int = 64
    max_token_ids_logprob: int = 1024  # ids in token_ids_logprob
    # (logprob, id) pairs the logprob options of one request may hold
    max_logprob_pairs: int = 1 << 22
    # process-group master addresses allowed beside loopback ones
    dist_allow: tuple[str, ...] = ()
    # tensor updates may carry fd / shared-memory handles (trainer on this host)
    local_tensor_handles: bool = False
    reasoning_parser: str | None = None  # `<think>` apart on the chat route (reasoning.py)
    tool_call_parser: str | None = None  # tool_calls on the chat route (tool_parser.py)
    constrained_json_disable_any_whitespace: bool = False  # SGLang's flags for json_schema
    constrained_json_max_whitespace_cnt: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in (
            "max_request_bytes",
            "max_n",
            "max_new_tokens_cap",
            "max_batch",
            "harvest_feed_records",
            "max_queued_requests",
            "max_token_ids_logprob",
            "max_logprob_pairs",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_top_logprobs_num < 0:
            raise ValueError("max_top_logprobs_num must be >= 0")
        if self.reasoning_parser is not None and self.reasoning_parser not in PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(PARSERS)}, got {self.reasoning_parser!r}")
        if self.tool_call_parser is not None and self.tool_call_parser not in FORMATS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(FORMATS)}, got {self.tool_call_parser!r}")
        if not is_loopback(self.host) and not self.admin_api_key:
            raise ValueError(
                f"binding {self.host} (not a loopback address) needs "
                "--admin-api-key: without one, anyone who reaches the port can "
                "replace the weights"
            )
        if self.harvest_feed and not (self.admin_api_key or self.api_key):
            raise ValueError(
                "--harvest-feed needs --admin-api-key (or --api-key): the feed holds every prompt and completion"
            )
