"""Loading a drafter for the serving target: loaded and checked in the caller's thread (the old one keeps drafting
meanwhile), swapped in between two iterations by the engine (`server/engine/swap.py`). SD is lossless, so running
requests simply continue; their draft states are rebuilt from the target's hidden states on the next iteration. A
drafter that does not fit the target is refused with `CheckpointError` and nothing changes."""

from __future__ import annotations

from gleanrl.server.model.packed_linear import can_pack, linear
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import CheckpointError


def load_for_target(path: str, runner: ModelRunner, target_config: dict):
    """Load the drafter at `path` on the target's device and dtype, or raise CheckpointError."""
    from gleanrl.harvest.checkpoint import DrafterCheckpointError, load_drafter

    text_config = target_config.get("text_config", target_config)
    try:
        drafter = load_drafter(path, runner.device, target_config=text_config, embed_tokens=runner.embed.weight)
    except (DrafterCheckpointError, OSError) as exc:
        raise CheckpointError(f"drafter {path}: {exc}") from None
    c = drafter.config
    if c.vocab_size != runner.vocab_size or c.target_hidden_size != runner.hidden_size:
        raise CheckpointError(
            f"drafter {path} was made for vocabulary {c.vocab_size} and hidden size {c.target_hidden_size}; the target "
            f"has {runner.vocab_size} and {runner.hidden_size}"
        )
    if not (-1 <= c.aux_layer_ids[0] and c.aux_layer_ids[-1] <= runner.num_layers - 2):
        raise CheckpointError(
            f"drafter {path} captures layer ids {c.aux_layer_ids}; this engine captures ids "
            f"-1..{runner.num_layers - 2} of its {runner.num_layers}-layer target"
        )
    drafter = drafter.to(dtype=runner.dtype)
    pack = can_pack([p for name, p in drafter.named_parameters() if p.dim() == 2 and "embed" not in name])
    return drafter.fuse_for_inference(lambda w: linear(w, None, pack))  # oneDNN-packed where bit-identical
