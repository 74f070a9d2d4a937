"""Weight updates over HTTP: outputs become the new model's greedy outputs and carry the new
version; a request held in place while the update lands says which tokens each version produced."""

from __future__ import annotations

import threading

import httpx
import torch

from engine_util import hf_greedy
from serving import running_server, server_stats, wait_until

GREEDY = {"temperature": 0, "ignore_eos": True}


def test_update_weights_from_disk_switches_outputs_and_version(tiny_qwen2, tiny_qwen2_b):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    hf_a, hf_b = (
        AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in (tiny_qwen2, tiny_qwen2_b)
    )
    ids = tok.encode("The quick brown fox")
    want_a, want_b = hf_greedy(hf_a, ids, 8), hf_greedy(hf_b, ids, 8)
    assert want_a != want_b
    with running_server(tiny_qwen2) as url:

        def gen(n=8):
            r = httpx.post(
                f"{url}/generate",
                timeout=120,
                json={"input_ids": ids, "sampling_params": {"max_new_tokens": n, **GREEDY}},
            )
            assert r.status_code == 200, r.text
            return r.json()

        first = gen()
        assert first["output_ids"] == want_a and first["meta_info"]["weight_version"] == "default"
        long = {}
        t = threading.Thread(target=lambda: long.update(out=gen(600)))
        t.start()
        assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 1)
        # the long request is held mid-way (in place) when the update lands
        httpx.post(f"{url}/pause_generation", json={"mode": "in_place"})
        r = httpx.post(
            f"{url}/update_weights_from_disk",
            timeout=120,
            json={"model_path": str(tiny_qwen2_b), "weight_version": "v2"},
        )
        httpx.post(f"{url}/continue_generation")
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        assert "v2" in r.json()["message"] and r.json()["num_paused_requests"] == 0
        after = gen()
        assert after["output_ids"] == want_b and after["meta_info"]["weight_version"] == "v2"
        info = httpx.get(f"{url}/model_info").json()
        assert info["weight_version"] == "v2" and info["model_path"] == str(tiny_qwen2_b)
        t.join(120)
        # the update did not drop it
        assert long["out"]["meta_info"]["finish_reason"]["type"] == "length"
        meta = long["out"]["meta_info"]
        assert meta["weight_version"] == "v2"
        spans = meta["weight_versions"]  # SGLang 0.5.23: which version produced which output tokens
        assert [s["version"] for s in spans] == ["default", "v2"] and spans[0]["start"] == 0
        assert 0 < spans[0]["end"] == spans[1]["start"] < spans[1]["end"] == 600
        assert long["out"]["output_ids"][: spans[0]["end"]] == hf_greedy(hf_a, ids, spans[0]["end"])
        assert after["meta_info"]["weight_versions"] == [{"version": "v2", "start": 0, "end": 8}]
