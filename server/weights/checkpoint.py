"""Loading and validating target checkpoints (Hugging Face directories with safetensors).

A weight update is checked fully before anything is swapped: the directory and `config.json` exist, the architecture and
model_type equal the serving model's, every safetensors file opens (a truncated or corrupt file fails its header check),
the tensor names and shapes equal the serving checkpoint's and so do the dtypes but floating point ones (cast to the
serving dtype at load: a float32 update of a model shipped in bf16), and the loaded weights are finite (corrupt data
behind an intact header). Any failure raises `CheckpointError` with the reason; the caller keeps its old weights."""

from __future__ import annotations

import json
from pathlib import Path

from gleanrl.base.dtypes import fits
from gleanrl.server.protocol import CheckpointError

Signature = dict[str, tuple[tuple[int, ...], str]]  # tensor name -> (shape, dtype)


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"model path {str(model_dir)!r} is not a directory")
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{model_dir}: no config.json") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{model_dir}: unreadable config.json ({exc})") from None


def checkpoint_signature(model_dir: str | Path) -> Signature:
    """Names, shapes and dtypes of all tensors in the directory's safetensors files (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: no .safetensors weights")
    index = Path(model_dir) / "model.safetensors.index.json"
    if index.exists():
        try:
            wanted = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{model_dir}: unreadable model.safetensors.index.json ({exc})") from None
        missing = wanted - {f.name for f in files}
        if missing:
            raise CheckpointError(f"{model_dir}: shards missing: {sorted(missing)}")
    sig: Signature = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    sl = fh.get_slice(name)
                    sig[name] = (tuple(sl.get_shape()), str(sl.get_dtype()))
        except Exception as exc:  # safetensors raises its own error type for truncated/corrupt files
            raise CheckpointError(f"{f}: corrupt or truncated safetensors file ({exc})") from None
    return sig


def compare(model_dir: str, config: dict, sig: Signature, ref_config: dict, ref_sig: Signature) -> None:
    """Raise CheckpointError unless (config, sig) matches the serving checkpoint's."""
    for key in ("architectures", "model_type"):
        if config.get(key) != ref_config.get(key):
            raise CheckpointError(
                f"{model_dir}: {key} {config.get(key)!r} differs from the serving model's {ref_config.get(key)!r}"
            )
    missing, extra = sorted(set(ref_sig) - set(sig)), sorted(set(sig) - set(ref_sig))
    if missing or extra:
        raise CheckpointError(f"{model_dir}: tensor names differ (missing {missing[:5]}, unexpected {extra[:5]})")
    for name, (shape, dtype) in ref_sig.items():
        if not fits(*sig[name], shape, dtype):
            raise CheckpointError(
                f"{model_dir}: tensor {name} is {list(sig[name][0])} {sig[name][1]}, expected {list(shape)} {dtype}"
            )


def load_checked(model_dir: str, ref_config: dict, ref_sig: Signature, device: str, dtype: str):
    """Validate `model_dir` against the serving checkpoint, then load it; returns (runner, config, sig)."""
    from gleanrl.server.model.runner import ModelRunner

    config, sig = read_config(model_dir), checkpoint_signature(model_dir)
    compare(model_dir, config, sig, ref_config, ref_sig)
    try:
        runner = ModelRunner.load(model_dir, device=device, dtype=dtype)
    except Exception as exc:  # anything transformers raises on a bad directory
        raise CheckpointError(f"{model_dir}: could not load ({type(exc).__name__}: {exc})") from None
    for name, param in runner.model.named_parameters():  # corrupt data behind an intact header
        if not bool(param.isfinite().all()):
            raise CheckpointError(f"{model_dir}: tensor {name} holds NaN or infinite values (corrupt file?)")
    return runner, config, sig
