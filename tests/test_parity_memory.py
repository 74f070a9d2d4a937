"""/release_memory_occupation and /resume_memory_occupation on the embedded server (issue 13, item
5): refused unless idle; generation refused (400) while released; the KV slot pool is dropped and
rebuilt; a weight push between release and resume (the co-located RL cycle) is served after resume;
the drafter survives the cycle (SD still runs with it); unknown tags refused by name."""

from __future__ import annotations

import threading

import httpx
import torch

from engine_util import hf_greedy
from sd_util import trained_drafter
from serving import running_app, wait_until
from test_parity_weights_tensor import by_value, tensors

PROMPT = "The quick brown fox"


def post(url, path, body):
    return httpx.post(f"{url}{path}", json=body, timeout=120)


def greedy(url, tok, n=16):
    return post(
        url,
        "/generate",
        {
            "input_ids": tok.encode(PROMPT),
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        },
    )


def test_release_resume_cycle_keeps_the_drafter(tiny_qwen2, tiny_qwen2_b, tiny_tokenizer, tok, tmp_path):
    from transformers import AutoModelForCausalLM

    hf_b = AutoModelForCausalLM.from_pretrained(tiny_qwen2_b, dtype=torch.float32).eval()
    drafter = trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path / "drafter")
    with running_app(tiny_qwen2, drafter=str(drafter), sd="on") as (url, app):
        before = greedy(url, tok).json()
        assert before["meta_info"]["spec_verify_ct"] > 0
        busy = threading.Thread(target=greedy, args=(url, tok, 400))
        busy.start()
        assert wait_until(lambda: app.state.engine.stats()["num_running_reqs"] > 0)
        r = post(url, "/release_memory_occupation", {})
        assert r.status_code == 400 and "idle" in r.json()["message"]
        busy.join()
        assert post(url, "/release_memory_occupation", {"tags": ["gpu"]}).status_code == 400
        r = post(url, "/release_memory_occupation", {})
        assert r.status_code == 200 and r.json()["success"] and app.state.engine.scheduler.pool is None
        refused = greedy(url, tok)
        assert refused.status_code == 400 and "resume_memory_occupation" in refused.json()["error"]["message"]
        r = post(
            url,
            "/update_weights_from_tensor",
            {"serialized_named_tensors": [by_value(tensors(tiny_qwen2_b))], "weight_version": "b"},
        )
        assert r.status_code == 200, r.text
        assert post(url, "/resume_memory_occupation", {"tags": ["weights"]}).status_code == 200
        assert greedy(url, tok).status_code == 400  # kv_cache and cuda_graph are still released
        assert post(url, "/resume_memory_occupation", {}).status_code == 200
        assert app.state.engine.scheduler.pool is not None
        after = greedy(url, tok).json()
        assert after["output_ids"] == hf_greedy(hf_b, tok.encode(PROMPT), 16)
        assert after["meta_info"]["weight_version"] == "b" and after["meta_info"]["spec_verify_ct"] > 0
        assert httpx.get(f"{url}/model_info").json()["draft_model_path"] == str(drafter)
