"""Request bodies, each built in one place, in the shapes of SGLang 0.5.23's `io_struct` types (`GenerateReqInput`,
`UpdateWeightFromDiskReqInput`, `BeginWeightUpdateReqInput`, `UpdateWeightsFromTensorReqInput`);
tests/sglang/test_push_requests.py parses them with SGLang's own types, so SGLang drops no field of ours.

Hazard: stock SGLang has no `selector` on `/update_weights_from_disk` (ignored: the load reaches every runner), so
`disk_body` leaves it out unless asked: only gleanrl's embedded server is sent `selector: "draft"` that way.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SELECTORS = ("target", "draft")


def generate_body(
    input_ids: list[int], sampling_params: dict, return_logprob: bool, rid: str | None, stream: bool
) -> dict:
    body = dict(input_ids=input_ids, sampling_params=sampling_params, return_logprob=return_logprob, stream=stream)
    if rid is not None:
        body["rid"] = rid
    return body


def disk_body(
    model_path: str,
    weight_version: str | None = None,
    flush_cache: bool = True,
    abort_all_requests: bool = False,
    selector: str | None = None,
) -> dict:
    body: dict = {"model_path": model_path, "flush_cache": flush_cache, "abort_all_requests": abort_all_requests}
    if weight_version is not None:
        body["weight_version"] = weight_version
    if selector is not None:
        body["selector"] = _checked(selector)
    return body


def begin_body(selector: str) -> dict:
    return {"selector": _checked(selector)}


def tensor_body(
    named: Iterable[tuple[str, torch.Tensor]],
    selector: str,
    weight_version: str | None = None,
    flush_cache: bool = False,
    tp_size: int = 1,
) -> dict:
    """Tensors by value, one identical payload per TP rank. A draft update never carries a `weight_version`:
    SGLang keeps one for all runners, and the policy's must stay."""
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if selector == "draft" and weight_version is not None:
        raise ValueError("a draft update must not carry a weight_version (SGLang would overwrite the policy's)")
    body = {
        "serialized_named_tensors": [encode_named_tensors(named)] * tp_size,
        "selector": _checked(selector),
        "flush_cache": flush_cache,
        "abort_all_requests": False,
    }
    if weight_version is not None:
        body["weight_version"] = weight_version
    return body


def encode_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Base64 of a plain pickle of [(name, cpu tensor)]: by value (SGLang's SafeUnpickler rebuilds them with
    `torch.load(weights_only=True)`), so the trainer may be on another host (unlike SGLang's in-process
    Engine's ForkingPickler handles)."""
    payload = [(name, t.detach().to("cpu").contiguous().clone()) for name, t in named]
    return base64.b64encode(pickle.dumps(payload, protocol=4)).decode("ascii")


def _checked(selector: str) -> str:
    if selector not in SELECTORS:
        raise ValueError(f"selector must be 'target' or 'draft', got {selector!r}")
    return selector
