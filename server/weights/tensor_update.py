"""Weight updates from named tensors (SGLang's /update_weights_from_tensor), atomic and validated like disk updates, for
the target or the drafter (`selector`): the checks, and the runner or drafter they become (`server/engine/swap.py`).

Target: every tensor must name a tensor of the serving checkpoint with its shape and finite values; it is cast to the
serving dtype. A copy of the serving model with the tensors becomes a new runner, swapped in like a disk update (same
drain / pause semantics, `weight_version`, `flush_cache`): a refused update changes nothing. Names the update does not
carry keep their current values, so a bucketed push may send a subset per call; inside a `/begin_weight_update` ...
`/end_weight_update` session the calls are staged and applied together at its end (one swap, one copy of the model).

Draft: the tensors overlay the served drafter's checkpoint (its config and files give the rest); the result is written
to a temporary directory and loaded with the same checks as a disk drafter update. The reported `draft_model_path` stays
that checkpoint's, as SGLang keeps `model_path` on tensor updates."""

from __future__ import annotations

import copy
import math
import shutil
import tempfile
from pathlib import Path

import torch

from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import CheckpointError
from gleanrl.server.weights.checkpoint import Signature
from gleanrl.server.weights.drafter import load_for_target

NamedTensors = list[tuple[str, torch.Tensor]]


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


def check_target(named: NamedTensors, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Tensors that passed `check_named`, by name, in the serving `dtype`; CheckpointError on the first not finite."""
    out = {}
    for name, t in named:
        if t.is_floating_point() and not bool(t.isfinite().all()):
            raise CheckpointError(f"tensor {name} holds NaN or infinite values")
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
