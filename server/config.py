"""Engine configuration and the loopback test: small, validated at construction."""

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


SOURCES = ("eagle", "group", "fused")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The SD controller's settings (`server/sd/controller.py`), named as `gleanrl serve`'s flags;
    EngineConfig has them too (a subclass), so they reach the controller unrenamed."""

    # off | on (the best plan that drafts, wherever one exists) | adaptive (the cost-model controller)
    sd: str = "adaptive"
    sd_max_batch: int = 8  # adaptive: EAGLE-3 drafts only while running <= this
    num_draft_tokens: int | None = None  # fixed EAGLE-3 draft length; None: chosen per iteration
    # eagle (EAGLE-3 chains), group (group drafts), fused (both as two branches of one tree). EAGLE-only keeps a seeded
    # request's samples independent of the other requests
    sd_sources: tuple[str, ...] = ("eagle",)
    group_max_batch: int = 64  # adaptive: group drafts only while running <= this

    def __post_init__(self) -> None:
        if self.sd not in ("off", "on", "adaptive"):
            raise ValueError(f"sd must be off, on or adaptive, got {self.sd!r}")
        if self.sd_max_batch < 1 or self.group_max_batch < 1:
            raise ValueError("sd_max_batch and group_max_batch must be >= 1")
        if self.num_draft_tokens is not None and not 1 <= self.num_draft_tokens <= 16:
            raise ValueError("num_draft_tokens must be in [1, 16]")
        if not self.sd_sources or any(s not in SOURCES for s in self.sd_sources):
            raise ValueError(f"sd_sources must be a non-empty subset of eagle, group, fused; got {self.sd_sources}")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig(ControllerConfig):
    model_path: str
    device: str = "cpu"  # cpu | cuda
    # auto (float32 on cpu, bfloat16 on cuda) | float32 | bfloat16 | float16
    dtype: str = "auto"
    max_running_requests: int = 32  # requests decoding at once; the rest wait in the queue
    context_length: int | None = None  # None: the model's max_position_embeddings
    seed: int = 0
    # torch intra-op threads for the engine (None: torch's default)
    num_threads: int | None = None
    drafter: str | None = None  # EAGLE-3 drafter directory (checked here, once)
    # output tokens the group index holds (all prompts and versions)
    group_max_tokens: int = 1 << 19
    group_keep_versions: int = 2  # policy versions whose samples the group index keeps
    # a target swap waits this long for running requests, then is refused
    swap_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        ControllerConfig.__post_init__(self)  # (slots: no zero-argument super())
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context_length must be >= 2")
        if self.sd == "off" and self.drafter:
            raise ValueError("a drafter needs sd 'on' or 'adaptive' (sd 'off' never drafts)")
        if self.drafter:
            from gleanrl.harvest.checkpoint import check_drafter_dir

            check_drafter_dir(self.drafter)
        for name in ("group_max_tokens", "group_keep_versions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not self.swap_timeout_s > 0:
            raise ValueError("swap_timeout_s must be > 0")
