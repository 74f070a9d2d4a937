"""Serving a drafter: the decoder an engine starts with, and loading a drafter for the serving target.

A drafter is loaded and checked in the caller's thread (the old one keeps drafting meanwhile) and swapped
in between two iterations by the engine's weight swapper. SD is lossless, so running requests simply
continue; their draft states are rebuilt from the target's hidden states on the next iteration. A
drafter that does not fit the target is refused with `CheckpointError` and nothing changes.
"""
from __future__ import annotations

from collections.abc import Callable

from gleanrl.server.config import EngineConfig
from gleanrl.server.decode import PlainDecoder
from gleanrl.server.model_runner import ModelRunner
from gleanrl.server.protocol import CheckpointError
from gleanrl.server.sd.decoder import SpecDecoder
from gleanrl.server.sd.fused_decoder import FusedDecoder
from gleanrl.server.sd.group_drafts import GroupDrafts
from gleanrl.server.sd.group_index import GroupIndexConfig
from gleanrl.server.sd.policy import SDPolicy, SDPolicyConfig
from gleanrl.server.sd.source_policy import GroupSDConfig, SourcePolicy


def load_for_target(path: str, runner: ModelRunner, target_config: dict):
    """Load the drafter at `path` on the target's device and dtype, or raise CheckpointError."""
    from gleanrl.harvest.checkpoint import DrafterCheckpointError, load_drafter

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


def build_decoder(cfg: EngineConfig, runner: ModelRunner, target_config: dict,
                  target_version: Callable[[], str] = lambda: "default") -> PlainDecoder | SpecDecoder:
    """`sd="off"`: plain decoding (a drafter is refused); EAGLE-3 as the only source: the SD decoder, which
    decodes plainly until a drafter is served; with group drafts among the sources: the fused decoder,
    which drafts from the group index from the start (`target_version` ages its samples)."""
    plain = PlainDecoder()
    if cfg.sd == "off":
        return plain
    sd = SDPolicyConfig(mode=cfg.sd, max_batch=cfg.sd_max_batch, fixed_k=cfg.num_draft_tokens, seed=cfg.seed)
    if cfg.sd_sources == ("eagle",):
        spec = SpecDecoder(plain, SDPolicy(sd))
    else:
        groups = GroupDrafts(GroupIndexConfig(max_tokens=cfg.group_max_tokens, keep_versions=cfg.group_keep_versions))
        policy = SourcePolicy(sd, GroupSDConfig(sources=cfg.sd_sources, group_max_batch=cfg.group_max_batch))
        spec = FusedDecoder(plain, policy, groups, target_version)
    if cfg.drafter_path:
        spec.set_drafter(load_for_target(cfg.drafter_path, runner, target_config), cfg.drafter_path)
    return spec
