"""Engine configuration and the loopback test: small, validated at construction."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from gleanrl.base.flags import flag

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
    """The SD controller's settings (`server/sd/controller.py`), `gleanrl serve`'s flags by the same
    names; EngineConfig has them too (a subclass), so they reach the controller unrenamed."""

    # on: the best plan that drafts, wherever one exists; adaptive: the cost-model controller
    sd: str = flag("adaptive", "speculative decoding", choices=["off", "on", "adaptive"])
    # 16: on the 32-layer policy at 1 thread a harvested drafter ran 2.31x plain at 16 running (AVX2 EPYC, 2026-12-07)
    sd_max_batch: int = flag(16, "adaptive: EAGLE-3 drafts only while this many requests run")
    num_draft_tokens: int | None = flag(
        None, "fixed EAGLE-3 draft length (None: chosen per iteration by the cost model)"
    )
    sd_sources: tuple[str, ...] = flag(
        ("eagle",),
        "draft sources the SD controller may choose per sequence: eagle (the EAGLE-3 chain), group (continuations "
        "from the same prompt's other running and earlier samples, no model cost), fused (both, as two branches "
        "verified in one pass); e.g. eagle,group,fused. Lossless either way, but with group drafts a seeded sample "
        "also depends on the other samples of its prompt, so seeded runs no longer repeat exactly",
        sep=",",
    )
    group_max_batch: int = flag(64, "group drafts only while this many requests run")

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
    model_path: str = flag(
        help="Hugging Face model directory (safetensors, tokenizer, chat template); required",
        name=("model", "model_path"),
    )
    device: str = flag("cpu", "where the engine runs", choices=["cpu", "cuda"])
    dtype: str = flag(
        "auto",
        "auto: float32 on cpu, bfloat16 on cuda. On CPUs with AVX-512 BF16 (or AMX), bfloat16 decodes ~1.5-2x "
        "faster and makes speculative decoding pay (verify is memory-bound)",
        choices=["auto", "float32", "bfloat16", "float16"],
    )
    max_running_requests: int = flag(32, "requests decoding at once; the rest queue")
    context_length: int | None = flag(None, "None: the model's max_position_embeddings")
    chunked_prefill_size: int = flag(
        1024,
        "prompt tokens prefilled per iteration, over all requests: smaller is fairer to the running requests (a long "
        "prompt slows each of their iterations less), larger prefills a long prompt in fewer, longer iterations",
    )
    prefill_share: float = flag(
        1.0,
        "the most of the engine's time prompt prefill may take while requests decode, in chunks of at most 4 decode "
        "iterations' time, also while none decodes (server/decode/iteration.py; e.g. 0.33 before untrusted clients: "
        "`bench load --hostile`'s mix then read <= 2x alone in 4 runs of 4). 1: unpaced. Off by default: pacing "
        "staggers the start of a batch that arrives over a few iterations and costs a GRPO step 8-15 percent "
        "(docs/reliability.md)",
    )
    seed: int = 0
    num_threads: int | None = flag(
        None, "torch intra-op threads for the engine (None: torch's default)", name="threads"
    )
    drafter: str | None = flag(None, "EAGLE-3 drafter directory")  # checked here, once
    group_max_tokens: int = flag(
        1 << 19,
        "output tokens the group index holds over all prompts and versions (memory: 170-340 bytes a token; the "
        "oldest finished samples go first, then the oldest running ones)",
    )
    group_keep_versions: int = flag(
        2,
        "policy versions (weight_version) whose samples the group index keeps; older finished samples age out when "
        "a new target version is loaded",
    )
    swap_timeout_s: float = flag(
        600.0, "seconds a target weight update waits for running requests before it is refused", name="swap_timeout"
    )

    def __post_init__(self) -> None:
        ControllerConfig.__post_init__(self)  # (slots: no zero-argument super())
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        for name in ("max_running_requests", "chunked_prefill_size", "group_max_tokens", "group_keep_versions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 0 < self.prefill_share <= 1:
            raise ValueError(f"prefill_share must be in (0, 1], got {self.prefill_share}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context_length must be >= 2")
        if self.sd == "off" and self.drafter:
            raise ValueError("a drafter needs sd 'on' or 'adaptive' (sd 'off' never drafts)")
        if self.drafter:
            from gleanrl.harvest.checkpoint import check_drafter_dir

            check_drafter_dir(self.drafter)
        if not self.swap_timeout_s > 0:
            raise ValueError("swap_timeout_s must be > 0")
