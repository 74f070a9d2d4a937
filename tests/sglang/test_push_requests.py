"""gleanrl's SGLang push requests, parsed by SGLang's own request types in SGLang's venv (as its FastAPI
routes parse them), so field names and encodings cannot drift: no field of ours may be one SGLang
silently drops, and the tensors SGLang's SafeUnpickler rebuilds must equal what was sent. The
distributed (NCCL) and draft paths cannot run on CPU; these checks are what CI proves for them."""
from __future__ import annotations

import json

import pytest
import torch
from sglang_util import run_in_sglang

from gleanrl.clients.sglang_push import (distributed_requests, draft_distributed_requests, draft_tensor_requests,
                                 init_group_request, policy_disk_request, tensor_requests)

pytestmark = pytest.mark.sglang

PARSE = r"""
import json, sys, msgspec
from pydantic import TypeAdapter
from sglang.srt.managers import io_struct as io
from sglang.srt.utils.common import MultiprocessingSerializer, normalize_serialized_named_tensor_payloads
types = {"/update_weights_from_disk": io.UpdateWeightFromDiskReqInput,
         "/begin_weight_update": io.BeginWeightUpdateReqInput, "/end_weight_update": io.EndWeightUpdateReqInput,
         "/update_weights_from_tensor": io.UpdateWeightsFromTensorReqInput,
         "/update_weights_from_distributed": io.UpdateWeightsFromDistributedReqInput,
         "/init_weights_update_group": io.InitWeightsUpdateGroupReqInput}
out = []
for path, body in json.load(open(sys.argv[1])):
    cls = types[path]
    obj = TypeAdapter(cls).validate_python(body)
    known = {f.name for f in msgspec.structs.fields(cls)}
    row = {"path": path, "type": type(obj).__name__, "dropped": sorted(set(body) - known)}
    for name in ("selector", "weight_version", "flush_cache", "names", "dtypes", "shapes", "group_name",
                 "model_path", "backend", "world_size", "rank_offset", "master_port"):
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
    assert all(r["dropped"] == [] for r in rows), rows     # SGLang would ignore these fields silently
    return rows


def test_all_push_requests_parse_as_sglang_types(tmp_path):
    gen = torch.Generator().manual_seed(0)
    named = [("midlayer.self_attn.q_proj.weight", torch.randn(8, 16, generator=gen)),
             ("fc.weight", torch.randn(4, 12, generator=gen).to(torch.bfloat16)),
             ("d2t", torch.arange(5, dtype=torch.int64))]
    requests = [("/update_weights_from_disk", policy_disk_request("/ckpt/weight_v3", "3")),
                *draft_tensor_requests(named, tp_size=2),
                *tensor_requests(named[:1], "target", weight_version="7", flush_cache=True),
                ("/init_weights_update_group", init_group_request("10.0.0.1", 29500, world_size=3)),
                *draft_distributed_requests([(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in named]),
                *distributed_requests([("model.norm.weight", "float32", [64])], "target", weight_version="8")]
    rows = _parse(tmp_path, requests)
    assert [r["type"] for r in rows] == [
        "UpdateWeightFromDiskReqInput", "BeginWeightUpdateReqInput", "UpdateWeightsFromTensorReqInput",
        "EndWeightUpdateReqInput", "BeginWeightUpdateReqInput", "UpdateWeightsFromTensorReqInput",
        "EndWeightUpdateReqInput", "InitWeightsUpdateGroupReqInput", "BeginWeightUpdateReqInput",
        "UpdateWeightsFromDistributedReqInput", "EndWeightUpdateReqInput", "BeginWeightUpdateReqInput",
        "UpdateWeightsFromDistributedReqInput", "EndWeightUpdateReqInput"]
    disk, begin, draft, _, _, policy_tensor, _, group, _, draft_dist, _, _, policy_dist, _ = rows
    assert disk["model_path"] == "/ckpt/weight_v3" and disk["weight_version"] == "3" and "selector" not in disk
    assert begin["selector"] == "draft" and draft["selector"] == "draft" and draft_dist["selector"] == "draft"
    # a draft push never carries a weight_version (SGLang has one version for all runners) nor flushes
    assert draft["weight_version"] is None and draft["flush_cache"] is False and draft_dist["weight_version"] is None
    assert policy_tensor["selector"] == "target" and policy_tensor["weight_version"] == "7"
    assert policy_dist["selector"] == "target" and policy_dist["weight_version"] == "8"
    assert len(draft["ranks"]) == 2 and draft["ranks"][0] == draft["ranks"][1]
    sent = [[n, str(t.dtype), list(t.shape), float(t.double().sum())] for n, t in named]
    assert draft["ranks"][0] == sent                      # rebuilt by SGLang's SafeUnpickler, by value
    assert draft_dist["names"] == [n for n, _ in named] and draft_dist["dtypes"] == ["float32", "bfloat16", "int64"]
    assert draft_dist["shapes"] == [[8, 16], [4, 12], [5]]
    assert (group["master_port"], group["world_size"], group["rank_offset"], group["backend"]) == (29500, 3, 1, "nccl")
