"""Loading and validating weight updates: target checkpoints (Hugging Face directories with safetensors), drafters and
named tensors.

A weight update is checked fully before anything is swapped: the directory and `config.json` exist, the architecture and
model_type equal the serving model's, every safetensors file opens (a truncated or corrupt file fails its header check),
the tensor names and shapes equal the serving checkpoint's and so do the dtypes but floating point ones (cast to the
serving dtype at load: a float32 update of a model shipped in bf16), and the loaded weights are finite (corrupt data
behind an intact header). Any failure raises `CheckpointError` with the reason; the caller keeps its old weights.

A drafter for the serving target (`load_for_target`) is loaded and checked the same way, in the caller's thread (the old
one keeps drafting meanwhile), and swapped in between two iterations (`server/engine/swap.py`). SD is lossless, so
running requests simply continue; their draft states are rebuilt from the target's hidden states.

Named tensors (SGLang's /update_weights_from_tensor) are updates as atomic and validated as disk updates, for the target
or the drafter (`selector`): the checks, and the runner or drafter they become (`server/engine/swap.py`). Target: every
tensor must name a tensor of the serving checkpoint with its shape and finite values; it is cast to the serving dtype. A
copy of the serving model with the tensors becomes a new runner, swapped in like a disk update (same drain / pause
semantics, `weight_version`, `flush_cache`): a refused update changes nothing. Names the update does not carry keep
their current values, so a bucketed push may send a subset per call; inside a `/begin_weight_update` ...
`/end_weight_update` session the calls are staged and applied together at its end (one swap, one copy of the model).

Draft: the tensors overlay the served drafter's checkpoint (its config and files give the rest); the result is written
to a temporary directory and loaded with the same checks as a disk drafter update. The reported `draft_model_path` stays
that checkpoint's, as SGLang keeps `model_path` on tensor updates."""

from __future__ import annotations

import copy
import json
import math
import shutil
import tempfile
from pathlib import Path

import torch

from gleanrl.base.dtypes import fits
from gleanrl.server.model.packed_linear import can_pack, linear, transposed_layout
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import CheckpointError

Signature = dict[str, tuple[tuple[int, ...], str]]  # tensor name -> (shape, dtype)
NamedTensors = list[tuple[str, torch.Tensor]]


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
    # oneDNN-packed where bit-identical (bf16), fused weights held transposed where that is faster (float32)
    return drafter.fuse_for_inference(lambda w: linear(w, None, pack), transposed_layout(runner.dtype, runner.device))


def check_named(want: Signature, selector: str, named: NamedTensors) -> None:
    """CheckpointError unless each name is a distinct tensor of `want` (the signature of `selector`'s model) with its
    shape and dtype kind (floating or not: an integer tensor is never cast into a float weight, nor the reverse).
    Metadata only: the cheap checks, run before anything reads the data."""
    if len({n for n, _ in named}) != len(named):
        raise CheckpointError("names: a tensor is listed twice")
    for name, t in named:
        if name not in want:
            raise CheckpointError(f"tensor {name!r} is not a tensor of the served {selector} model")
        shape, dtype = want[name]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"tensor {name} is {list(t.shape)}, expected {list(shape)}")
        # safetensors' floating dtypes: F16, F32, F64, BF16, F8_*
        if t.dtype.is_floating_point != dtype.startswith(("F", "BF")) or t.dtype.is_complex:
            raise CheckpointError(f"tensor {name} is {str(t.dtype).removeprefix('torch.')}, expected {dtype}")


def check_volume(want: Signature, selector: str, names: list[str], shapes: list) -> None:
    """Before buffers of the listed shapes are allocated: CheckpointError unless the list could be a
    push of `selector`'s model (no more tensors, nor elements, than it has; no negative sizes)."""
    if len(names) > len(want):
        raise CheckpointError(f"names: {len(names)} tensors listed; the served {selector} model has {len(want)}")
    if any(d < 0 for s in shapes for d in s):
        raise CheckpointError("shapes: a size is negative")
    listed, held = sum(math.prod(s) for s in shapes), sum(math.prod(s) for s, _ in want.values())
    if listed > held:
        raise CheckpointError(f"shapes: {listed} elements listed; the served {selector} model has {held}")


def _check_finite(name: str, t: torch.Tensor) -> None:
    if t.is_floating_point() and not bool(t.isfinite().all()):
        raise CheckpointError(f"tensor {name} holds NaN or infinite values")


def check_update(want: Signature, selector: str, named: NamedTensors) -> None:
    """CheckpointError unless each tensor is a distinct tensor of `want` (`selector`'s signature) with its shape and
    dtype kind, and, for the target, finite."""
    check_named(want, selector, named)
    if selector == "target":
        for name, t in named:
            _check_finite(name, t)


def check_target(named: NamedTensors, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Tensors that passed `check_named`, by name, in the serving `dtype`; CheckpointError on the first not finite."""
    out = {}
    for name, t in named:
        _check_finite(name, t)
        out[name] = t.to(dtype)
    return out


def target_runner(runner: ModelRunner, staged: dict[str, torch.Tensor]) -> ModelRunner:
    """A copy of the serving `runner`'s model with the `staged` tensors, as a new runner."""
    model = copy.deepcopy(runner.model)
    state = model.state_dict()
    missing = [n for n in staged if n not in state]
    if missing:  # a checkpoint name the module does not hold (e.g. a tied lm_head)
        raise CheckpointError(f"tensor {missing[0]!r} has no parameter in the serving model")
    with torch.no_grad():
        for name, t in staged.items():
            state[name].copy_(t.to(state[name].device))
    return ModelRunner(model, str(runner.device))


def overlay_drafter(path: str, named: NamedTensors, runner: ModelRunner, target_config: dict):
    """The drafter at `path` with the `named` tensors (checked by `check_named`), loaded for the serving target."""
    from safetensors.torch import load_file, save_file

    src = Path(path)
    base = {k: v for f in sorted(src.glob("*.safetensors")) for k, v in load_file(f).items()}
    for name, t in named:
        base[name] = t.to(base[name].dtype).contiguous()
    tmp = Path(tempfile.mkdtemp(prefix="gleanrl-draft-"))
    try:
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy(f, tmp / f.name)
        save_file(base, str(tmp / "model.safetensors"))
        return load_for_target(str(tmp), runner, target_config)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
