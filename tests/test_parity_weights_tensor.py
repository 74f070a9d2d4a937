"""/update_weights_from_tensor on the embedded server (issue 13, item 5, tensor part): by-value
pickles and SGLang's flattened_bucket format, target and draft selectors, begin/end sessions staging
bucketed calls into one atomic swap, and refusals (shape, name, NaN, a pickle that would run code)
that keep the old weights."""

from __future__ import annotations

import base64
import pickle
import sys
import types
from dataclasses import dataclass

import httpx
import pytest
import torch
from safetensors.torch import load_file

from engine_util import hf_greedy
from sd_util import random_drafter, trained_drafter
from serving import greedy_ids, post, running_server

PROMPT = "The quick brown fox"


def tensors(path) -> list[tuple[str, torch.Tensor]]:
    return [kv for f in sorted(path.glob("*.safetensors")) for kv in sorted(load_file(f).items())]


def by_value(named) -> str:
    return base64.b64encode(pickle.dumps([(n, t.contiguous().clone()) for n, t in named], protocol=4)).decode()


@dataclass
class FlattenedTensorMetadata:
    # pickled under SGLang's module name, as SGLang's FlattenedTensorBucket does
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def flattened(named, monkeypatch) -> str:
    module = "sglang.srt.weight_sync.tensor_bucket"
    for i in range(len(module.split("."))):
        name = ".".join(module.split(".")[: i + 1])
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    FlattenedTensorMetadata.__module__ = module
    sys.modules[module].FlattenedTensorMetadata = FlattenedTensorMetadata
    flats, meta, at = [], [], 0
    for n, t in named:
        flat = t.contiguous().flatten().view(torch.uint8)
        meta.append(FlattenedTensorMetadata(n, t.shape, t.dtype, at, at + flat.numel(), flat.numel()))
        flats.append(flat)
        at += flat.numel()
    return base64.b64encode(pickle.dumps({"flattened_tensor": torch.cat(flats), "metadata": meta})).decode()


@pytest.fixture(scope="module")
def hf_b(tiny_qwen2_b):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen2_b, dtype=torch.float32).eval()


@pytest.mark.parametrize("engine_process", [False, True], ids=["embedded", "engine_process"])
def test_target_push_by_value_flattened_and_in_a_session(
    tiny_qwen2, tiny_qwen2_b, hf, hf_b, tok, monkeypatch, engine_process
):
    ids = tok.encode(PROMPT)
    want_a, want_b = hf_greedy(hf, ids, 10), hf_greedy(hf_b, ids, 10)
    assert want_a != want_b
    named = tensors(tiny_qwen2_b)
    with running_server(tiny_qwen2, engine_process=engine_process) as url:
        r = post(
            url, "/update_weights_from_tensor", {"serialized_named_tensors": [by_value(named)], "weight_version": "v1"}
        )
        assert r.status_code == 200 and r.json()["success"], r.text
        assert greedy_ids(url, tok.encode(PROMPT))["output_ids"] == want_b
        info = httpx.get(f"{url}/model_info").json()
        assert info["weight_version"] == "v1" and info["model_path"] == str(tiny_qwen2)
        # back to A in a session of two buckets, one of them flattened; nothing
        # changes before the end
        first, rest = named[: len(named) // 2], named[len(named) // 2 :]
        named_a = dict(tensors(tiny_qwen2))
        assert post(url, "/begin_weight_update", {"selector": "target"}).json()["success"]
        assert post(
            url,
            "/update_weights_from_tensor",
            {"serialized_named_tensors": [by_value([(n, named_a[n]) for n, _ in first])]},
        ).json()["success"]
        assert post(
            url,
            "/update_weights_from_tensor",
            {
                "serialized_named_tensors": [flattened([(n, named_a[n]) for n, _ in rest], monkeypatch)],
                "load_format": "flattened_bucket",
                "weight_version": "v2",
            },
        ).json()["success"]
        assert greedy_ids(url, tok.encode(PROMPT))["output_ids"] == want_b
        assert httpx.get(f"{url}/model_info").json()["weight_version"] == "v1"
        assert post(url, "/end_weight_update", {}).json()["success"]
        out = greedy_ids(url, tok.encode(PROMPT))
        assert out["output_ids"] == want_a and out["meta_info"]["weight_version"] == "v2"


class Evil:
    def __reduce__(self):
        import os

        return (os.system, ("true",))


@pytest.mark.parametrize("engine_process", [False, True], ids=["embedded", "engine_process"])
def test_refusals_keep_the_old_weights(tiny_qwen2, tok, engine_process):
    with running_server(tiny_qwen2, engine_process=engine_process) as url:
        before = greedy_ids(url, tok.encode(PROMPT))["output_ids"]
        name, t = tensors(tiny_qwen2)[0]
        cases = [
            ([(name, torch.zeros(3, 3))], "expected"),
            ([("no.such.weight", t)], "not a tensor"),
            ([(name, torch.full_like(t, float("nan")))], "NaN"),
        ]
        for named, why in cases:
            r = post(
                url,
                "/update_weights_from_tensor",
                {"serialized_named_tensors": [by_value(named)], "weight_version": "bad"},
            )
            assert r.status_code == 400 and why in r.json()["message"], r.text
        evil = base64.b64encode(pickle.dumps([("x", Evil())])).decode()
        r = post(url, "/update_weights_from_tensor", {"serialized_named_tensors": [evil]})
        assert r.status_code == 400 and "system is not allowed" in r.json()["message"], r.text
        assert post(url, "/end_weight_update", {}).status_code == 400  # no session open
        assert greedy_ids(url, tok.encode(PROMPT))["output_ids"] == before
        assert httpx.get(f"{url}/model_info").json()["weight_version"] == "default"


def test_draft_push_changes_the_drafter_not_the_output(tiny_qwen2, tiny_tokenizer, tok, tmp_path):
    trained = trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path / "trained")
    rand = random_drafter(tiny_qwen2, tmp_path / "random", seed=3)
    with running_server(tiny_qwen2, drafter=str(trained), sd="on") as url:
        fast = greedy_ids(url, tok.encode(PROMPT), 32)
        r = post(
            url,
            "/update_weights_from_tensor",
            {"serialized_named_tensors": [by_value(tensors(rand))], "selector": "draft"},
        )
        assert r.status_code == 200, r.text
        slow = greedy_ids(url, tok.encode(PROMPT), 32)
        assert slow["output_ids"] == fast["output_ids"]  # lossless: only the speed changes
        assert slow["meta_info"]["spec_accept_length"] < fast["meta_info"]["spec_accept_length"]
        assert httpx.get(f"{url}/model_info").json()["draft_model_path"] == str(trained)
        bad = post(
            url,
            "/update_weights_from_tensor",
            {"serialized_named_tensors": [by_value([("fc.weight", torch.zeros(2, 2))])], "selector": "draft"},
        )
        assert bad.status_code == 400 and "fc.weight" in bad.json()["message"]
