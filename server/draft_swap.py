"""Serving a drafter: building the SD step at startup and hot-swapping drafters while requests run.

`update_weights(selector="draft")` validates and loads the new drafter in the caller's thread (the old
one keeps drafting meanwhile); the decode thread swaps it in between two iterations (`apply`). SD is
lossless, so running requests simply continue; their draft states are rebuilt from the target's hidden
states on the next iteration. A drafter that does not fit the target is refused with `CheckpointError`
and nothing changes.
"""
from __future__ import annotations

from gleanrl.server.config import EngineConfig
from gleanrl.server.protocol import CheckpointError
from gleanrl.server.scheduler import Scheduler
from gleanrl.server.sd_policy import SDPolicy, SDPolicyConfig
from gleanrl.server.spec_step import SpecDecoder


def load_for_target(path: str, scheduler: Scheduler, target_config: dict):
    """Load the drafter at `path` on the target's device and dtype, or raise CheckpointError."""
    from gleanrl.harvest.checkpoint import DrafterCheckpointError, load_drafter

    runner = scheduler.runner
    try:
        drafter = load_drafter(path, runner.device, target_config=target_config.get("text_config", target_config),
                               embed_tokens=runner.embed.weight)
    except (DrafterCheckpointError, OSError) as exc:
        raise CheckpointError(f"drafter {path}: {exc}") from None
    c = drafter.config
    if c.vocab_size != runner.vocab_size or c.target_hidden_size != runner.hidden_size:
        raise CheckpointError(f"drafter {path} was made for vocabulary {c.vocab_size} and hidden size "
                              f"{c.target_hidden_size}; the target has {runner.vocab_size} and {runner.hidden_size}")
    if not (-1 <= c.aux_layer_ids[0] and c.aux_layer_ids[-1] <= runner.num_layers - 2):
        raise CheckpointError(f"drafter {path} captures layer ids {c.aux_layer_ids}; this engine captures "
                              f"ids -1..{runner.num_layers - 2} of its {runner.num_layers}-layer target")
    return drafter.to(dtype=runner.dtype).fuse_for_inference()


def install(scheduler: Scheduler, cfg: EngineConfig, target_config: dict) -> SpecDecoder:
    """Replace the scheduler's decode step with the SD step (plain decoding until a drafter is served)."""
    policy = SDPolicy(SDPolicyConfig(mode=cfg.sd, max_batch=cfg.sd_max_batch, fixed_k=cfg.num_draft_tokens,
                                     seed=cfg.seed))
    spec = SpecDecoder(scheduler, policy)
    if cfg.drafter_path:
        spec.set_drafter(load_for_target(cfg.drafter_path, scheduler, target_config), "default")
        spec.draft_path = cfg.drafter_path
    scheduler.decode_step = spec.decode_step
    return spec


def prepare(spec: SpecDecoder, path: str, version: str | None, target_config: dict) -> dict:
    """Load and check a drafter now; returns the engine's swap record whose `apply` runs between iterations."""
    drafter = load_for_target(path, spec.scheduler, target_config)

    def apply() -> None:
        keep = spec.scheduler.draft_weight_version
        spec.set_drafter(drafter, version if version is not None else keep or "default")
        spec.draft_path = path

    return {"apply": apply}
