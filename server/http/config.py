"""The HTTP server's configuration, validated at construction; `gleanrl serve`'s flags (`base.flags`)."""

from __future__ import annotations

from dataclasses import dataclass

from gleanrl.base.flags import flag
from gleanrl.server.config import is_loopback
from gleanrl.server.http.edge.body import MAX_REQUEST_BYTES, MAX_WEIGHT_REQUEST_BYTES
from gleanrl.server.http.generate.reasoning import PARSERS
from gleanrl.server.http.openai.tool_parser import FORMATS


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = flag("127.0.0.1", "address to listen on")
    port: int = flag(30000, "port to listen on")
    api_key: str | None = flag(
        None, "Bearer key for every route but /health (or env GLEANRL_API_KEY: not visible in ps)"
    )
    admin_api_key: str | None = flag(
        None, "Bearer key for weight updates, pause/continue, flush (or env GLEANRL_ADMIN_API_KEY)"
    )
    served_model_name: str | None = flag(None, "model name in /v1 (None: the directory's name)")
    # small: a refused body costs the event loop that feeds the engine the bytes it may push first
    max_request_bytes: int = flag(
        MAX_REQUEST_BYTES, "request bodies over this on every route but /update_weights_from_tensor: 413"
    )
    max_weight_request_bytes: int = flag(
        MAX_WEIGHT_REQUEST_BYTES,
        "request bodies over this on /update_weights_from_tensor (weights by value; admin key when one is set): 413",
    )
    max_n: int = flag(64, "largest n (samples per prompt) a request may ask for")
    max_new_tokens_cap: int | None = flag(
        None, "largest max_new_tokens a request may ask for (default: only the context length limits it)"
    )
    max_batch: int = flag(1024, "most sequences (prompts x n) one request may start")
    harvest_feed: bool = flag(
        False,
        "gleanrl extension: keep a bounded feed of finished requests at GET /harvest_feed (admin key) for "
        "`gleanrl harvest` beside a trainer that is not gleanrl's",
    )  # native/harvest_feed.py
    harvest_feed_records: int = flag(
        4096, "finished requests the feed holds; the oldest are dropped (and counted) beyond it"
    )
    max_queued_requests: int = flag(
        8192, "requests waiting for a slot; beyond it /generate and /v1 answer 503 with Retry-After"
    )
    max_top_logprobs_num: int = flag(64, "largest top_logprobs_num a request may ask")  # and /v1/completions logprobs
    max_token_ids_logprob: int = flag(1024, "most ids in token_ids_logprob")
    max_logprob_pairs: int = flag(
        1 << 22, "(logprob, id) pairs the logprob options of one request may hold (positions x options)"
    )
    dist_allow: tuple[str, ...] = flag(
        (),
        "a process-group master_address /init_weights_update_group may join besides loopback (repeatable)",
        metavar="HOST",
    )
    local_tensor_handles: bool = flag(
        False,
        "/update_weights_from_tensor may carry fd / shared-memory handles (a trainer on this host, as SGLang's "
        "same-host path); off: tensors by value only",
    )
    engine_process: bool = flag(
        True,
        "run the engine in a process of its own, so that reading and checking what clients send never takes the "
        "decode thread's GIL (off: one process, the engine's thread beside the HTTP edge)",
    )
    reasoning_parser: str | None = flag(
        None,
        "separate <think>...</think> into reasoning_content on the chat route (SGLang's names)",
        choices=sorted(PARSERS),
    )
    tool_call_parser: str | None = flag(
        None,
        "parse tool calls into tool_calls on the chat route (SGLang's names: qwen25 / qwen and hermes <tool_call> "
        "JSON, llama3 JSON)",
        choices=sorted(FORMATS),
    )
    constrained_json_disable_any_whitespace: bool = flag(
        False, "json_schema output without free whitespace (SGLang's flag)"
    )
    constrained_json_max_whitespace_cnt: int | None = flag(
        None, "most whitespace characters in a row in json_schema output (SGLang's flag)"
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        positive = """max_request_bytes max_weight_request_bytes max_n max_new_tokens_cap max_batch harvest_feed_records
        max_queued_requests max_token_ids_logprob max_logprob_pairs"""
        for name in positive.split():
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
                f"binding {self.host} (not a loopback address) needs --admin-api-key: without one, anyone who "
                "reaches the port can replace the weights"
            )
        if self.harvest_feed and not (self.admin_api_key or self.api_key):
            raise ValueError(
                "--harvest-feed needs --admin-api-key (or --api-key): the feed holds every prompt and completion"
            )
