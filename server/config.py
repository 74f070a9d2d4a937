"""Engine and server configuration: small dataclasses validated at construction."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or a loopback name (brackets of an IPv6 literal allowed)."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str
    device: str = "cpu"                    # cpu | cuda
    dtype: str = "auto"                    # auto (float32 on cpu, bfloat16 on cuda) | float32 |
                                           # bfloat16 | float16
    max_running_requests: int = 32         # requests decoding at once; the rest wait in the queue
    context_length: int | None = None      # None: the model's max_position_embeddings
    seed: int = 0
    num_threads: int | None = None         # torch intra-op threads for the engine (None:
                                           # torch's default)
    drafter_path: str | None = None        # EAGLE-3 drafter directory
    sd: str = "adaptive"                   # off | on | adaptive (the cost-model controller,
                                           # server/sd/controller)
    sd_max_batch: int = 8                  # adaptive: EAGLE-3 drafts only while running <= this
    num_draft_tokens: int | None = None    # fixed EAGLE-3 draft length; None: chosen per iteration
    sd_sources: tuple[str, ...] = ("eagle",)  # the SD controller's sources: eagle, group,
    #   fused. EAGLE-only keeps a seeded request's samples independent of the other requests
    group_max_batch: int = 64              # group drafts only while running <= this
    group_max_tokens: int = 1 << 19        # output tokens the group index holds (all
                                           # prompts and versions)
    group_keep_versions: int = 2           # policy versions whose samples the group index keeps
    swap_timeout_s: float = 600.0          # a target swap waits this long for running requests,
                                           # then is refused

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError("dtype must be auto, float32, bfloat16 or float16, "
                             f"got {self.dtype!r}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context_length must be >= 2")
        if self.sd not in ("off", "on", "adaptive"):
            raise ValueError(f"sd must be off, on or adaptive, got {self.sd!r}")
        if self.sd == "off" and self.drafter_path:
            raise ValueError("a drafter needs sd 'on' or 'adaptive' (sd 'off' never drafts)")
        if self.sd_max_batch < 1:
            raise ValueError("sd_max_batch must be >= 1")
        if self.num_draft_tokens is not None and not 1 <= self.num_draft_tokens <= 16:
            raise ValueError("num_draft_tokens must be in [1, 16]")
        if not self.sd_sources or any(s not in ("eagle", "group", "fused")
                                      for s in self.sd_sources):
            raise ValueError("sd_sources must be a non-empty subset of eagle, group, fused; "
                             f"got {self.sd_sources}")
        for name in ("group_max_batch", "group_max_tokens", "group_keep_versions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not self.swap_timeout_s > 0:
            raise ValueError("swap_timeout_s must be > 0")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None             # guards everything but /health
    admin_api_key: str | None = None       # guards weight updates, pause/continue and flush
    served_model_name: str | None = None   # the name in /v1/models (default: the model
                                           # directory's name)
    max_request_bytes: int = 8 * 1024 * 1024
    max_n: int = 64
    max_new_tokens_cap: int | None = None  # None: only the context length limits
                                           # max_new_tokens (SGLang)
    max_batch: int = 1024                  # engine requests (prompts x n) one HTTP
                                           # request may start
    harvest_feed: bool = False             # gleanrl extension: GET /harvest_feed (admin key),
                                           # server.harvest_feed
    harvest_feed_records: int = 4096       # finished requests the feed holds (oldest
                                           # dropped and counted)
    max_queued_requests: int = 8192        # engine requests waiting for a slot; beyond: 503
                                           # with Retry-After
    max_top_logprobs_num: int = 64         # top_logprobs_num (and OpenAI's logprobs /
                                           # top_logprobs) per request
    max_token_ids_logprob: int = 1024      # ids in token_ids_logprob
    max_logprob_pairs: int = 1 << 22       # (logprob, id) pairs the logprob options of one
                                           # request may hold
    dist_allow: tuple[str, ...] = ()       # process-group master addresses allowed
                                           # beside loopback ones
    local_tensor_handles: bool = False     # tensor updates may carry fd / shared-memory handles
                                           # (trainer on this host)
    reasoning_parser: str | None = None    # `<think>` apart on the chat route (server.http.reasoning)
    tool_call_parser: str | None = None    # tool_calls on the chat route (server.http.tool_parser)
    constrained_json_disable_any_whitespace: bool = False   # SGLang's flags for json_schema
    constrained_json_max_whitespace_cnt: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in ("max_request_bytes", "max_n", "max_new_tokens_cap", "max_batch",
                     "harvest_feed_records", "max_queued_requests", "max_token_ids_logprob",
                     "max_logprob_pairs"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_top_logprobs_num < 0:
            raise ValueError("max_top_logprobs_num must be >= 0")
        from gleanrl.server.http.reasoning import PARSERS
        if self.reasoning_parser is not None and self.reasoning_parser not in PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
        from gleanrl.server.http.tool_parser import FORMATS
        if self.tool_call_parser is not None and self.tool_call_parser not in FORMATS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(FORMATS)}, "
                             f"got {self.tool_call_parser!r}")
        if not is_loopback(self.host) and not self.admin_api_key:
            raise ValueError(f"binding {self.host} (not a loopback address) needs "
                             "--admin-api-key: without one, anyone who reaches the port can "
                             "replace the weights")
        if self.harvest_feed and not (self.admin_api_key or self.api_key):
            raise ValueError("--harvest-feed needs --admin-api-key (or --api-key): the feed "
                             "holds every prompt and completion")
