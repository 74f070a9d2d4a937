"""The requests gleanrl's client sends to stock SGLang, recorded from production code
(`weight_sync`'s pushes and the client's /generate, against a fake SGLang) and parsed by SGLang's
own request types in SGLang's venv (as its FastAPI routes parse them), so field names and encodings
cannot drift: no field of ours may be one SGLang silently drops, and the tensors SGLang's
SafeUnpickler rebuilds must equal what was sent. The draft path cannot run on CPU (SGLang has no SD
there); these checks are what CI proves for it."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from safetensors.torch import save_file

from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.weight_sync import push_drafter, push_policy
from sglang_util import run_in_sglang

pytestmark = pytest.mark.sglang

PARSE = r"""
import dataclasses, json, sys, msgspec
from pydantic import TypeAdapter
from sglang.srt.managers import io_struct as io
from sglang.srt.utils.common import MultiprocessingSerializer, normalize_serialized_named_tensor_payloads
types = {"/update_weights_from_disk": io.UpdateWeightFromDiskReqInput, "/generate": io.GenerateReqInput,
         "/begin_weight_update": io.BeginWeightUpdateReqInput, "/end_weight_update": io.EndWeightUpdateReqInput,
         "/update_weights_from_tensor": io.UpdateWeightsFromTensorReqInput}
out = []
for path, body in json.load(open(sys.argv[1])):
    cls = types[path]
    obj = TypeAdapter(cls).validate_python(body)
    fields = msgspec.structs.fields(cls) if issubclass(cls, msgspec.Struct) else dataclasses.fields(cls)
    known = {f.name for f in fields}
    row = {"path": path, "type": type(obj).__name__, "dropped": sorted(set(body) - known)}
    for name in ("selector", "weight_version", "flush_cache", "model_path", "input_ids", "rid", "stream",
                 "return_logprob"):
        if hasattr(obj, name):
            row[name] = getattr(obj, name)
    if cls is io.UpdateWeightsFromTensorReqInput:
        payloads = normalize_serialized_named_tensor_payloads(obj.serialized_named_tensors)
        row["ranks"] = [[[n, str(t.dtype), list(t.shape), float(t.double().sum())]
                         for n, t in MultiprocessingSerializer.deserialize(p)] for p in payloads]
    out.append(row)
print(json.dumps(out))
"""


def _parse(tmp_path, requests) -> list[dict]:
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(requests))
    rows = run_in_sglang(PARSE, str(path))
    # SGLang would ignore these fields silently
    assert all(r["dropped"] == [] for r in rows), rows
    return rows


def _recorded(spec: str | None, go) -> list[tuple[str, dict]]:
    """The POSTs `go(client)` sends to a fake stock SGLang (`speculative_algorithm` = spec)."""
    sent: list[tuple[str, dict]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"model_path": "/ckpt/v0", "speculative_algorithm": spec})
        sent.append((request.url.path, json.loads(request.content)))
        if request.url.path == "/generate":
            return httpx.Response(200, json={"text": "", "output_ids": [], "meta_info": {}})
        return httpx.Response(200, json={"success": True, "message": "Success"})

    async def run():
        async with RolloutClient(["http://sglang"]) as client:
            client._http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
            await go(client)

    asyncio.run(run())
    return sent


def test_production_requests_parse_as_sglang_types(tmp_path):
    gen = torch.Generator().manual_seed(0)
    named = {
        "midlayer.self_attn.q_proj.weight": torch.randn(8, 16, generator=gen),
        "fc.weight": torch.randn(4, 12, generator=gen).to(torch.bfloat16),
        "d2t": torch.arange(5),
    }
    save_file(named, tmp_path / "model.safetensors")
    ckpt = str(tmp_path)
    requests = (
        _recorded(None, lambda c: c.generate([1, 2, 3], {"max_new_tokens": 4, "sampling_seed": 7}, rid="r1"))
        + _recorded(None, lambda c: push_policy(c, "/ckpt/weight_v3", "3"))
        + _recorded("EAGLE3", lambda c: push_drafter(c, ckpt, 2))
        + _recorded("EAGLE3", lambda c: push_policy(c, ckpt, "7"))
    )
    rows = _parse(tmp_path, requests)
    assert [r["type"] for r in rows] == [
        "GenerateReqInput",
        "UpdateWeightFromDiskReqInput",
        "BeginWeightUpdateReqInput",
        "UpdateWeightsFromTensorReqInput",
        "EndWeightUpdateReqInput",
        "BeginWeightUpdateReqInput",
        "UpdateWeightsFromTensorReqInput",
        "EndWeightUpdateReqInput",
    ]
    generate, disk, begin, draft, _, policy_begin, policy_tensor, _ = rows
    assert generate["input_ids"] == [1, 2, 3] and generate["rid"] == "r1" and generate["return_logprob"] is True
    assert disk["model_path"] == "/ckpt/weight_v3" and disk["weight_version"] == "3" and "selector" not in disk
    assert begin["selector"] == "draft" and draft["selector"] == "draft"
    # a draft push never carries a weight_version (SGLang has one version for all
    # runners) nor flushes
    assert draft["weight_version"] is None and draft["flush_cache"] is False
    assert policy_begin["selector"] == "target" == policy_tensor["selector"] and policy_tensor["weight_version"] == "7"
    sent = [[n, str(t.dtype), list(t.shape), float(t.double().sum())] for n, t in sorted(named.items())]
    # rebuilt by SGLang's SafeUnpickler, by value
    assert draft["ranks"] == [sent]
