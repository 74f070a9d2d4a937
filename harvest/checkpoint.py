"""Drafter checkpoints in SGLang's EAGLE-3 format: `config.json` + `model.safetensors`, written atomically.

Keys (no `model.` prefix; SGLang's `LlamaForCausalLMEagle3.load_weights` adds it, fuses q/k/v and gate/up, reads `d2t`
as draft->target id offsets, skips `t2d`): `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`, and
`embed_tokens.weight` (optional on load: a frozen copy of the target's, which SGLang uses instead and SpecForge omits).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gleanrl.base.atomic import atomic_dir
from gleanrl.harvest.drafter import Eagle3Drafter
from gleanrl.harvest.drafter_config import DrafterConfig, _get

WEIGHTS = "model.safetensors"


class DrafterCheckpointError(ValueError):
    """A drafter directory that is missing, corrupt, or does not fit the target."""


def expected_shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    H, nh, nkv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    return {
        "embed_tokens.weight": (c.vocab_size, H),
        "fc.weight": (H, len(c.aux_layer_ids) * c.target_hidden_size),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (nh * d, 2 * H),
        "midlayer.self_attn.k_proj.weight": (nkv * d, 2 * H),
        "midlayer.self_attn.v_proj.weight": (nkv * d, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, nh * d),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (c.intermediate_size, H),
        "midlayer.mlp.up_proj.weight": (c.intermediate_size, H),
        "midlayer.mlp.down_proj.weight": (H, c.intermediate_size),
        "norm.weight": (H,),
        "lm_head.weight": (c.draft_vocab_size, H),
        "d2t": (c.draft_vocab_size,),
        "t2d": (c.vocab_size,),
    }


def save_drafter(drafter: Eagle3Drafter, out: str | Path) -> Path:
    """Write `drafter` to `out` atomically (readers see the old checkpoint or the new one)."""
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    with atomic_dir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(drafter.config.to_json(), indent=2) + "\n")
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        for f in tmp.iterdir():  # mkdtemp makes it private; a server may run as another user
            f.chmod(0o644)
        tmp.chmod(0o755)
    return Path(out)


def check_fit(c: DrafterConfig, target: Any) -> None:
    """Raise DrafterCheckpointError unless config `c` fits `target` (HF config, dict or model directory)."""
    if isinstance(target, (str, Path)):
        target = json.loads((Path(target) / "config.json").read_text())
    want = {
        "hidden size": (c.target_hidden_size, _get(target, "hidden_size")),
        "vocabulary size": (c.vocab_size, _get(target, "vocab_size")),
    }
    if c.target_num_hidden_layers is not None:
        want["layer count"] = (c.target_num_hidden_layers, _get(target, "num_hidden_layers"))
    for what, (mine, theirs) in want.items():
        if theirs is not None and int(mine) != int(theirs):
            raise DrafterCheckpointError(f"drafter was made for a target with {what} {mine}, this target has {theirs}")
    n = _get(target, "num_hidden_layers")
    if n is not None and c.aux_layer_ids[-1] > int(n) - 2:
        raise DrafterCheckpointError(f"drafter captures layer ids {c.aux_layer_ids}, beyond this {n}-layer target")


def check_drafter_dir(path: str | Path) -> None:
    """The one check of a `drafter` setting (serve, train, benches): an EAGLE-3 drafter directory, or ValueError."""
    try:
        _read_config(Path(path))
    except DrafterCheckpointError as exc:
        raise ValueError(f"drafter must be an EAGLE-3 drafter directory: {exc}") from None


def _read_config(path: Path) -> DrafterConfig:
    if not path.is_dir():
        raise DrafterCheckpointError(f"drafter checkpoint {path} does not exist or is not a directory")
    try:
        return DrafterConfig.from_json(json.loads((path / "config.json").read_text()))
    except FileNotFoundError:
        raise DrafterCheckpointError(f"{path} has no config.json") from None
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise DrafterCheckpointError(f"{path}/config.json is not a valid EAGLE-3 drafter config: {exc}") from None


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path / WEIGHTS), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError:
        raise DrafterCheckpointError(f"{path} has no {WEIGHTS}") from None
    except Exception as exc:  # safetensors' own error types for truncated or garbled files
        raise DrafterCheckpointError(f"{path}/{WEIGHTS} is corrupt: {exc}") from None


def _check_vocab(c: DrafterConfig, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    ids = d2t.long() + torch.arange(d2t.shape[0])
    if ids.min() < 0 or ids.max() >= c.vocab_size or ids.unique().numel() != ids.numel():
        raise DrafterCheckpointError("d2t maps draft ids outside the target vocabulary or onto the same id")
    if c.draft_vocab_size == c.vocab_size and d2t.any():
        raise DrafterCheckpointError("a full-size draft vocabulary must map to the target ids unchanged (d2t = 0)")
    if t2d.sum() != ids.numel() or not t2d.bool()[ids].all():
        raise DrafterCheckpointError("t2d does not mark exactly the target ids that d2t maps to")


def load_drafter(
    path: str | Path,
    device: str | torch.device = "cpu",
    target_config: Any = None,
    embed_tokens: torch.Tensor | None = None,
) -> Eagle3Drafter:
    """Load a drafter (eval mode), refusing one that does not fit `target_config`. `embed_tokens`: the target's
    embedding, shared in place of the checkpoint's copy (as SGLang); required where it has none (SpecForge)."""
    path = Path(path)
    c = _read_config(path)
    if target_config is not None:
        check_fit(c, target_config)
    state, shapes = _read_weights(path), expected_shapes(c)
    if "embed_tokens.weight" not in state:
        if embed_tokens is None:
            raise DrafterCheckpointError(f"{path} has no embed_tokens.weight; pass the target's embedding")
        state["embed_tokens.weight"] = torch.zeros(shapes["embed_tokens.weight"])  # replaced by the shared one
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise DrafterCheckpointError(f"{path}: missing weights {missing}, unexpected weights {extra}")
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise DrafterCheckpointError(f"{path}: {name} has shape {tuple(state[name].shape)}, config says {shape}")
        if state[name].is_floating_point() and not torch.isfinite(state[name]).all():
            raise DrafterCheckpointError(f"{path}: {name} contains NaN or inf")
    drafter = Eagle3Drafter(c)
    for name, want in drafter.state_dict().items():  # float widths are cast (bf16 files are common); kinds not
        if state[name].is_floating_point() != want.is_floating_point():
            raise DrafterCheckpointError(f"{path}: {name} is {state[name].dtype}, expected a {want.dtype}-like tensor")
    _check_vocab(c, state["d2t"], state["t2d"])
    drafter.load_state_dict({k: v.to(drafter.state_dict()[k].dtype) for k, v in state.items()})
    drafter.to(device)
    if embed_tokens is not None:
        try:
            drafter.share_embedding(embed_tokens)
        except ValueError as exc:
            raise DrafterCheckpointError(f"{path}: the target's {exc}") from None
    return drafter.eval()


_VERSION_DIR = re.compile(r"^v(\d+)$")


def drafter_dir(versions_dir: Path, version: int) -> Path:
    """Where pushed drafter version N lives (its `draft_weight_version` is str(N))."""
    return Path(versions_dir) / f"v{version:06d}"


def drafter_versions(versions_dir: Path) -> list[tuple[int, Path]]:
    """The drafter versions under `versions_dir`, oldest first."""
    return sorted((int(m[1]), p) for p in Path(versions_dir).glob("v*") if (m := _VERSION_DIR.match(p.name)))
