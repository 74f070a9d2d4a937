"""Serving a drafter: the decoder an engine starts with, and loading a drafter for the
serving target.

A drafter is loaded and checked in the caller's thread (the old one keeps drafting meanwhile) and
swapped in between two iterations by the engine's weight swapper. SD is lossless, so running
requests simply continue; their draft states are rebuilt from the target's hidden states on the next
iteration. A drafter that does not fit the target is refused with `CheckpointError` and
nothing changes.
"""
from __future__ import annotations

from collections.abc import Callable

from gleanrl.server.config import EngineConfig
from gleanrl.server.model.packed_linear import can_pack, linear
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import CheckpointError
from gleanrl.server.sd.controller import Controller, ControllerConfig
from gleanrl.server.sd.decoder import SDDecoder
from gleanrl.server.sd.group_drafts import GroupDrafts
from gleanrl.server.sd.group_index import GroupIndexConfig


def load_for_target(path: str, runner: ModelRunner, target_config: dict):
    """Load the drafter at `path` on the target's device and dtype, or raise CheckpointError."""
    from gleanrl.harvest.checkpoint import DrafterCheckpointError, load_drafter

    try:
        drafter = load_drafter(path, runner.device,
                               target_config=target_config.get("text_config", target_config),
                               embed_tokens=runner.embed.weight)
    except (DrafterCheckpointError, OSError) as exc:
        raise CheckpointError(f"drafter {path}: {exc}") from None
    c = drafter.config
    if c.vocab_size != runner.vocab_size or c.target_hidden_size != runner.hidden_size:
        raise CheckpointError(f"drafter {path} was made for vocabulary {c.vocab_size} "
                              f"and hidden size {c.target_hidden_size}; the target "
                              f"has {runner.vocab_size} and {runner.hidden_size}")
    if not (-1 <= c.aux_layer_ids[0] and c.aux_layer_ids[-1] <= runner.num_layers - 2):
        raise CheckpointError(f"drafter {path} captures layer ids {c.aux_layer_ids}; this "
                              f"engine captures ids -1..{runner.num_layers - 2} of "
                              f"its {runner.num_layers}-layer target")
    drafter = drafter.to(dtype=runner.dtype)
    pack = can_pack([p for name, p in drafter.named_parameters()
                     if p.dim() == 2 and "embed" not in name])
    # oneDNN-packed where bit-identical
    return drafter.fuse_for_inference(lambda w: linear(w, None, pack))


def build_decoder(cfg: EngineConfig, runner: ModelRunner, target_config: dict,
                  target_version: Callable[[], str] = lambda: "default") -> SDDecoder:
    """`sd="off"`: plain decoding only (a drafter is refused); otherwise the controller chooses
    among the sources of `sd_sources` (eagle: the EAGLE-3 chain, from when a drafter is served;
    group: group drafts from the start, `target_version` ages their samples; fused: both as two
    branches). The target pass cost is calibrated here when a source can draft (else before the
    first iteration with a drafter), the drafter's when one is loaded."""
    if cfg.sd == "off":
        return SDDecoder(None)
    ctl = Controller(ControllerConfig(mode=cfg.sd, eagle="eagle" in cfg.sd_sources,
                                      group="group" in cfg.sd_sources,
                                      fused="fused" in cfg.sd_sources,
                                      eagle_max_batch=cfg.sd_max_batch,
                                      group_max_batch=cfg.group_max_batch,
                                      fixed_k=cfg.num_draft_tokens))
    groups = GroupDrafts(GroupIndexConfig(max_tokens=cfg.group_max_tokens, keep_versions=cfg.group_keep_versions)) \
        if ctl.config.group else None
    dec = SDDecoder(ctl, groups, target_version)
    if groups is not None or cfg.drafter_path:
        ctl.cost.calibrate(runner)
    if cfg.drafter_path:
        dec.set_drafter(load_for_target(cfg.drafter_path, runner, target_config), cfg.drafter_path)
    return dec
