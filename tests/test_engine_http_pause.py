"""SGLang's pause/flush/update behaviour over HTTP, as slime and AReaL drive it: `/pause_generation`
modes with requests in flight (a streaming one ends with an abort chunk carrying its partial tokens
and logprobs), `/flush_cache` after abort or retract, a 400 naming `mode` for an unknown one, and a
disk update without a pause that answers only after the running request has finished."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from serving import running_app, server_stats, wait_until

PROMPT = "The quick brown fox"
LONG = 400


@pytest.fixture(scope="module", params=[False, True], ids=["embedded", "engine_process"])
def url(tiny_qwen2, request):
    with running_app(tiny_qwen2, engine_process=request.param) as (url, _):
        yield url


def _greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def _in_background(url: str, body: dict) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        r = httpx.post(f"{url}/generate", json=body, timeout=120)
        box["status"], box["text"] = r.status_code, r.text

    t = threading.Thread(target=run)
    t.start()
    assert wait_until(
        lambda: server_stats(url)["num_running_reqs"] == 1 and server_stats(url)["generation_tokens_total"] > 0
    )
    return t, box


def test_abort_mode_ends_a_stream_with_its_partial_output_and_flush_succeeds(url):
    body = {"text": PROMPT, "stream": True, "return_logprob": True, "sampling_params": _greedy(LONG)}
    t, box = _in_background(url, body)
    try:
        # SGLang's default mode: abort
        r = httpx.post(f"{url}/pause_generation", json={}, timeout=60)
        assert r.status_code == 200 and r.json() == {"message": "Generation paused successfully.", "status": "ok"}
        t.join(60)
        chunks = [
            json.loads(line[6:])
            for line in box["text"].splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
        last = chunks[-1]
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(last["output_ids"]) < LONG
        assert len(last["meta_info"]["output_token_logprobs"]) == len(last["output_ids"])
        assert httpx.get(f"{url}/flush_cache").status_code == 200
        assert httpx.post(f"{url}/flush_cache").status_code == 200
    finally:
        httpx.post(f"{url}/continue_generation", json={})


def test_retract_mode_resumes_the_request_to_the_same_output(url):
    want = httpx.post(f"{url}/generate", json={"text": PROMPT, "sampling_params": _greedy(LONG)}, timeout=120).json()
    t, box = _in_background(url, {"text": PROMPT, "sampling_params": _greedy(LONG)})
    try:
        assert httpx.post(f"{url}/pause_generation", json={"mode": "retract"}, timeout=60).status_code == 200
        stats = server_stats(url)
        assert stats["num_running_reqs"] == 0 and stats["num_queue_reqs"] == 1
        assert httpx.post(f"{url}/flush_cache").status_code == 200
    finally:
        httpx.post(f"{url}/continue_generation", json={})
    t.join(120)
    out = json.loads(box["text"])
    assert out["output_ids"] == want["output_ids"] and out["meta_info"]["finish_reason"]["type"] == "length"


def test_in_place_mode_keeps_flush_refused_and_unknown_mode_is_400(url):
    t, box = _in_background(url, {"text": PROMPT, "sampling_params": _greedy(LONG)})
    try:
        assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}, timeout=60).status_code == 200
        assert httpx.post(f"{url}/flush_cache").status_code == 400  # a request still holds its KV
        r = httpx.post(f"{url}/pause_generation", json={"mode": "bogus"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "mode" and "bogus" in r.text
    finally:
        httpx.post(f"{url}/continue_generation", json={})
    t.join(120)
    assert json.loads(box["text"])["meta_info"]["completion_tokens"] == LONG


def test_disk_update_without_pause_waits_for_the_running_request(url, tiny_qwen2):
    t, box = _in_background(url, {"text": PROMPT, "sampling_params": _greedy(LONG)})
    r = httpx.post(
        f"{url}/update_weights_from_disk", timeout=120, json={"model_path": str(tiny_qwen2), "weight_version": "w2"}
    )
    # it answered only once the request was done
    idle_at_answer = server_stats(url)["num_running_reqs"] == 0
    t.join(120)
    assert r.status_code == 200 and idle_at_answer
    meta = json.loads(box["text"])["meta_info"]
    assert meta["completion_tokens"] == LONG and meta["weight_version"] == "default"
    # no mixed versions
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": LONG}]
