"""Header-level checks of a checkpoint directory before it is pushed to a rollout server. Stock SGLang (0.5.23)
applies whatever `/update_weights_from_disk` gets: a truncated safetensors file kills the server, another
architecture's weights load and report success. So a candidate must match the served directory: complete safetensors
headers consistent with the file sizes, the same tensor names and shapes, the same non-float dtypes (floats are cast at
load), the same `architectures` and `model_type`. Pure Python: JSON headers and file sizes only.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from gleanrl.base.dtypes import fits

_DTYPE_BYTES = {
    **dict.fromkeys(("BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2"), 1),
    **dict.fromkeys(("U16", "I16", "F16", "BF16"), 2),
    **dict.fromkeys(("U32", "I32", "F32"), 4),
    **dict.fromkeys(("U64", "I64", "F64"), 8),
}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit
_INDEX = "model.safetensors.index.json"
EAGLE3_ARCHS = ("LlamaForCausalLMEagle3",)


class CheckpointMismatch(ValueError):
    """The checkpoint must not be pushed; the message says why."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]


def read_safetensors_header(path: str | Path) -> dict[str, TensorSpec]:
    """Tensor specs of one safetensors file; raises CheckpointMismatch if the file is incomplete."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointMismatch(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise CheckpointMismatch(
                f"{path}: truncated or corrupt safetensors header (header says {n} bytes, file has {size})"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointMismatch(f"{path}: corrupt safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointMismatch(f"{path}: corrupt safetensors header (not a JSON object)")
    specs, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, stop) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointMismatch(f"{path}: corrupt safetensors header entry for {name!r}") from None
        if dtype not in _DTYPE_BYTES or stop - begin != math.prod(shape) * _DTYPE_BYTES[dtype] or begin < 0:
            raise CheckpointMismatch(f"{path}: tensor {name!r} has inconsistent dtype/shape/offsets")
        specs[name], end = TensorSpec(dtype, shape), max(end, stop)
    if 8 + n + end != size:
        raise CheckpointMismatch(
            f"{path}: truncated safetensors file ({size} bytes on disk, the header describes {8 + n + end})"
        )
    return specs


def read_tensor_specs(model_dir: str | Path) -> dict[str, TensorSpec]:
    """All tensors of a checkpoint directory (single file or sharded with an index)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointMismatch(f"{model_dir}: not a directory")
    index = model_dir / _INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointMismatch(f"{index}: unreadable index ({exc})") from None
        files = sorted({model_dir / f for f in weight_map.values()})
        if missing := [f.name for f in files if not f.exists()]:
            raise CheckpointMismatch(f"{model_dir}: shards named in the index are missing: {missing[:5]}")
    else:
        files, weight_map = sorted(model_dir.glob("*.safetensors")), None
    if not files:
        raise CheckpointMismatch(f"{model_dir}: no safetensors files")
    specs: dict[str, TensorSpec] = {}
    for file in files:
        for name, spec in read_safetensors_header(file).items():
            if name in specs:
                raise CheckpointMismatch(f"{model_dir}: tensor {name!r} appears in more than one file")
            if weight_map is not None and weight_map.get(name) != file.name:
                raise CheckpointMismatch(f"{model_dir}: tensor {name!r} in {file.name} disagrees with the index")
            specs[name] = spec
    if weight_map is not None and set(weight_map) - set(specs):
        raise CheckpointMismatch(
            f"{model_dir}: tensors named in the index are missing: {sorted(set(weight_map) - set(specs))[:5]}"
        )
    return specs


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointMismatch(f"{model_dir}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise CheckpointMismatch(f"{path}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise CheckpointMismatch(f"{path}: not a JSON object")
    return config


def check_policy_checkpoint(candidate: str | Path, serving: str | Path) -> dict[str, TensorSpec]:
    """Refuse (CheckpointMismatch) a policy checkpoint that does not fit the serving model directory: its config
    must agree on `architectures` and `model_type`, its tensors be laid out alike."""
    new_cfg, ref_cfg = read_config(candidate), read_config(serving)
    if any(a in EAGLE3_ARCHS for a in new_cfg.get("architectures") or []):
        raise CheckpointMismatch(f"{candidate}: is an EAGLE-3 drafter; a policy push would load it into the target")
    for key in ("architectures", "model_type"):
        if new_cfg.get(key) != ref_cfg.get(key):
            raise CheckpointMismatch(
                f"{candidate}: {key} is {new_cfg.get(key)!r}, the serving model has {ref_cfg.get(key)!r}"
            )
    specs, reference = read_tensor_specs(candidate), read_tensor_specs(serving)
    missing, unexpected = sorted(set(reference) - set(specs)), sorted(set(specs) - set(reference))
    if missing or unexpected:
        raise CheckpointMismatch(
            f"{candidate}: tensor names differ from the serving model "
            f"(missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})"
        )
    for name, spec in reference.items():
        if not fits(specs[name].shape, specs[name].dtype, spec.shape, spec.dtype):
            raise CheckpointMismatch(
                f"{candidate}: tensor {name!r} is {specs[name].dtype}{list(specs[name].shape)}, "
                f"the serving model has {spec.dtype}{list(spec.shape)}"
            )
    return specs
