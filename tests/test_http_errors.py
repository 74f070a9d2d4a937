"""Bad input over HTTP: 400 naming the field, 413 over the body limit, 401 without the right key,
400 on refused weight updates, and the server answering correctly afterwards. Nothing may 500."""

from __future__ import annotations

import shutil

import httpx
import pytest

from gleanrl.tiny import make_tiny_model
from serving import running_server

USER, ADMIN = "sk-user-secret-1", "sk-admin-secret-2"
H_USER, H_ADMIN = {"Authorization": f"Bearer {USER}"}, {"Authorization": f"Bearer {ADMIN}"}
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def url(tiny_qwen2):
    with running_server(
        tiny_qwen2,
        api_key=USER,
        admin_api_key=ADMIN,
        max_request_bytes=4096,
        max_n=4,
        max_new_tokens_cap=256,
        context_length=128,
    ) as u:
        yield u


def post(url, path, body=None, headers=H_USER, **kw):
    return httpx.post(f"{url}{path}", headers=headers, timeout=60, **({"json": body} if body is not None else kw))


def reference(url):
    r = post(url, "/generate", {"text": "Hello", "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


BAD_GENERATE = [
    ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"temperature": -0.5}}, "temperature"),
    ({"text": "hi", "sampling_params": {"temperature": "hot"}}, "temperature"),
    ({"text": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
    ({"text": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
    ({"text": "hi", "sampling_params": {"n": 5}}, "n"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 257}}, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"bogus": 1}}, "bogus"),
    ({"text": "hi", "sampling_params": {"frequency_penalty": 2.5}}, "frequency_penalty"),
    ({"text": "hi", "sampling_params": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"text": "hi", "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 4}}, "min_new_tokens"),
    ({"text": "hi", "sampling_params": {"logit_bias": {"100000": 1.0}}}, "logit_bias"),
    ({"text": "hi", "sampling_params": {"logit_bias": {"x": 1.0}}}, "logit_bias"),
    ({"text": "hi", "sampling_params": {"stop_regex": "(unclosed"}}, "stop_regex"),
    ({"text": "hi", "sampling_params": {"json_schema": "{not json"}}, "json_schema"),
    ({"text": "hi", "sampling_params": {"regex": "(a"}}, "regex"),
    ({"text": "hi", "sampling_params": {"structural_tag": "{}"}}, "structural_tag"),
    ({"text": "hi", "sampling_params": {"ebnf": "root ::= 'a'"}}, "ebnf"),
    ({"text": "hi", "lora_path": "adapter"}, "lora_path"),
    ({"text": "hi", "return_hidden_states": True}, "return_hidden_states"),
    ({"text": "hi", "custom_logit_processor": "{}"}, "custom_logit_processor"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 127}}, "context length"),  # 1 + 127 > 128
    ({"text": "hi", "return_logprob": True, "logprob_start_len": 99}, "logprob_start_len"),
    ({"text": "hi", "sampling_params": {"sampling_seed": -1}}, "sampling_seed"),
    ({"text": "hi", "sampling_params": {"top_k": -2}}, "top_k"),
    ({"text": "hi", "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 1}]}, "sampling_params"),
    ({"input_ids": ["a", 2]}, "input_ids"),
    ({"input_ids": [1, 100000]}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": list(range(5, 133))}, "input_ids"),  # 128 tokens: not shorter than the context
    ({"text": 5}, "text"),
    ({"text": "hi", "input_ids": [1]}, "input_ids"),
    ({}, "text"),
    ({"text": ["a", "b"], "rid": "one"}, "rid"),
    ({"text": "hi", "stream": "yes"}, "stream"),
    ({"text": "hi", "return_logprob": 3}, "return_logprob"),
]


@pytest.mark.parametrize("body,field", BAD_GENERATE, ids=[f for _, f in BAD_GENERATE])
def test_bad_generate_is_400_naming_the_field(url, body, field):
    for stream in (False, True):
        r = post(url, "/generate", {**body, "stream": stream} if "stream" not in body else body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert field in err["message"] and err["code"] == 400


def test_malformed_json_oversized_body_and_server_still_correct(url):
    before = reference(url)
    for raw in (
        b"{not json",
        b"[1, 2]",
        b'{"text": "hi", "sampling_params": {"max_new_tokens": 1}',
        b'{"text": "hi", "sampling_params": {"temperature": NaN}}',
    ):
        r = post(url, "/generate", content=raw, headers={**H_USER, "content-type": "application/json"})
        assert r.status_code == 400 and "body" in r.json()["error"]["param"], r.text
    r = post(url, "/generate", {"text": "x" * 5000})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    for path in ("/update_weights_from_disk", "/abort_request"):
        assert (
            post(url, path, content=b"{oops", headers={**H_ADMIN, "content-type": "application/json"}).status_code
            == 400
        )
    assert post(url, "/update_weights_from_disk", {"model_path": 3}, headers=H_ADMIN).status_code == 400
    huge_k = post(url, "/generate", {"text": "hi", "sampling_params": {"top_k": 10**30, "max_new_tokens": 2}})
    assert huge_k.status_code == 200 and huge_k.json()["meta_info"]["completion_tokens"] == 2
    assert reference(url) == before


def test_auth(url):
    assert httpx.get(f"{url}/health").status_code == 200
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": USER}):
        r = httpx.post(f"{url}/generate", json={"text": "hi"}, headers=headers)
        assert r.status_code == 401 and USER not in r.text and ADMIN not in r.text
        assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 401
        assert httpx.get(f"{url}/metrics", headers=headers).status_code == 401
    assert httpx.get(f"{url}/model_info", headers=H_USER).status_code == 200
    for path in ("/pause_generation", "/continue_generation", "/flush_cache", "/update_weights_from_disk"):
        # user key is not enough
        assert post(url, path, {"model_path": "/nonexistent"}).status_code == 401, path
    assert post(url, "/abort_request", {"abort_all": True}).status_code == 401
    assert post(url, "/abort_request", {"abort_all": True}, headers=H_ADMIN).status_code == 200
    assert post(url, "/abort_request", {"rid": "nothing-running"}).status_code == 200
    assert post(url, "/pause_generation", {}, headers=H_ADMIN).status_code == 200
    assert post(url, "/continue_generation", {}, headers=H_ADMIN).status_code == 200


def test_refused_weight_updates_keep_serving_the_old_weights(url, tiny_qwen2, tiny_llama, tmp_path):
    before = reference(url)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_qwen2, corrupt)
    shard = next(corrupt.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:1000])
    wider = make_tiny_model(tmp_path / "wider", arch="qwen2", hidden_size=32, num_heads=2, num_kv_heads=1)
    for path in (tmp_path / "missing", corrupt, tiny_llama, wider):
        r = post(url, "/update_weights_from_disk", {"model_path": str(path), "weight_version": "bad"}, headers=H_ADMIN)
        assert r.status_code == 400, (path, r.text)
        body = r.json()
        assert body["success"] is False and body["message"] and body["num_paused_requests"] == 0
    r = post(
        url,
        "/update_weights_from_distributed",
        {"names": ["x"], "dtypes": ["float32"], "shapes": [[1]]},
        headers=H_ADMIN,
    )
    assert r.status_code == 400 and "init_weights_update_group" in r.json()["message"]
    r = post(url, "/update_weights_from_tensor", {"serialized_named_tensors": []}, headers=H_ADMIN)
    assert r.status_code == 400 and "serialized_named_tensors" in r.json()["error"]["message"]
    info = httpx.get(f"{url}/model_info", headers=H_USER).json()
    assert info["weight_version"] == "default" and info["model_path"] == str(tiny_qwen2)
    assert reference(url) == before
