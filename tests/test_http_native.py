"""SGLang's native API over a real server on a loopback port (httpx): generate single / batch / n /
stream / logprobs, greedy equal to transformers, concurrency, abort, disconnects, metrics, info."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
import torch

from engine_util import hf_greedy
from serving import running_app, server_stats, wait_until

PROMPTS = ["Hello, world!", "The quick brown fox", "def add(a, b):", "Question: what is 12 + 30?"]


@pytest.fixture(scope="module")
def srv(tiny_qwen2):
    with running_app(tiny_qwen2, max_running_requests=16) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def url(srv):
    return srv[0]


def gen(url, timeout=60, **body):
    r = httpx.post(f"{url}/generate", json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def greedy(new, **kw):
    return {"max_new_tokens": new, "temperature": 0, "ignore_eos": True, **kw}


def test_single_text_matches_transformers_with_logprobs(url, hf, tok):
    out = gen(url, text=PROMPTS[0], sampling_params=greedy(12), return_logprob=True)
    ids = tok.encode(PROMPTS[0])
    assert out["output_ids"] == hf_greedy(hf, ids, 12)
    assert out["text"] == tok.decode(out["output_ids"])
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(ids), 12)
    assert meta["weight_version"] == "default" and meta["e2e_latency"] > 0 and meta["id"]
    with torch.no_grad():  # logprob of each sampled token under the target's distribution
        logits = hf(torch.tensor([ids + out["output_ids"]])).logits[0, len(ids) - 1 : -1]
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(out["output_ids"])[:, None])[:, 0]
    got = meta["output_token_logprobs"]
    assert [t for _, t, _ in got] == out["output_ids"] and all(x is None for _, _, x in got)
    assert torch.allclose(torch.tensor([lp for lp, _, _ in got]), want, atol=1e-3)


def test_stop_string_as_str_or_list_is_trimmed_from_text_not_ids(url, tok):
    full = gen(url, text=PROMPTS[1], sampling_params=greedy(12))
    stop = full["text"][3:6]
    assert len(stop.strip()) >= 2
    for value in (stop, [stop, ""]):
        out = gen(url, text=PROMPTS[1], sampling_params={"max_new_tokens": 12, "temperature": 0, "stop": value})
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert out["text"] == full["text"][: full["text"].find(stop)]
        assert stop in tok.decode(out["output_ids"])


def test_batch_input_ids_and_n_expand_prompt_major(url, hf, tok):
    batch = [tok.encode(p) for p in PROMPTS[:2]]
    outs = gen(url, input_ids=batch, sampling_params=greedy(6, n=2), rid=["a", "b"])
    assert isinstance(outs, list) and len(outs) == 4
    for k, out in enumerate(outs):
        assert out["output_ids"] == hf_greedy(hf, batch[k // 2], 6)
        assert "output_token_logprobs" not in out["meta_info"]
    assert [o["meta_info"]["id"] for o in outs] == ["a-0", "a-1", "b-0", "b-1"]
    single_n = gen(url, text=PROMPTS[2], sampling_params={"max_new_tokens": 5, "n": 3, "sampling_seed": 7})
    assert isinstance(single_n, list) and len(single_n) == 3
    again = gen(url, text=PROMPTS[2], sampling_params={"max_new_tokens": 5, "n": 3, "sampling_seed": 7})
    # seed + i per sample
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in single_n]


def _sse(url, body, headers=None):
    chunks = []
    with httpx.stream("POST", f"{url}/generate", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


def test_stream_chunks_are_cumulative_and_end_like_non_stream(url):
    body = {"text": PROMPTS[1], "sampling_params": greedy(10), "return_logprob": True}
    chunks = _sse(url, {**body, "stream": True})
    plain = gen(url, **body)
    assert len(chunks) >= 2
    for a, b in zip(chunks, chunks[1:]):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["output_ids"] == plain["output_ids"] and last["text"] == plain["text"]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    assert len(last["meta_info"]["output_token_logprobs"]) == 10
    batch = _sse(url, {"text": PROMPTS[:2], "sampling_params": greedy(3), "stream": True})
    assert {c["index"] for c in batch} == {0, 1}
    sparse = _sse(url, {**body, "stream": True, "sampling_params": greedy(10, stream_interval=4)})
    sizes = [len(c["output_ids"]) for c in sparse]
    assert 2 <= len(sizes) <= 3 and sizes[-1] == 10 and all(n >= 4 * (k + 1) for k, n in enumerate(sizes[:-1]))
    assert sparse[-1]["text"] == plain["text"]


def test_sixteen_mixed_lengths_concurrent_correct_and_short_first(url, hf, tok):
    lengths = [2, 3, 120, 4, 90, 2, 60, 5, 3, 100, 2, 8, 4, 70, 3, 6]
    prompts = [tok.encode(PROMPTS[i % 4] + " " * (i // 4)) for i in range(16)]
    results, order = [None] * 16, []

    def one(i):
        results[i] = gen(url, timeout=300, input_ids=prompts[i], sampling_params=greedy(lengths[i]))
        order.append(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    # all 16 are in before the first step
    httpx.post(f"{url}/pause_generation", json={"mode": "in_place"})
    try:
        for t in threads:
            t.start()
        assert wait_until(lambda: server_stats(url)["num_queue_reqs"] == 16)
    finally:
        httpx.post(f"{url}/continue_generation")
    for t in threads:
        t.join()
    for i in range(16):
        assert results[i]["output_ids"] == hf_greedy(hf, prompts[i], lengths[i]), i
    short = [i for i in range(16) if lengths[i] <= 8]
    assert max(order.index(i) for i in short) < order.index(lengths.index(120))


def test_abort_by_rid_ends_the_stream_with_abort(url):
    chunks = []

    def consume():
        chunks.extend(
            _sse(url, {"text": PROMPTS[0], "rid": "to-abort", "stream": True, "sampling_params": greedy(900)})
        )

    t = threading.Thread(target=consume)
    t.start()
    assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 1)
    # keeps it mid-way until the abort lands
    httpx.post(f"{url}/pause_generation", json={"mode": "in_place"})
    try:
        assert httpx.post(f"{url}/abort_request", json={"rid": "to-abort"}).status_code == 200
        t.join(60)
    finally:
        httpx.post(f"{url}/continue_generation")
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(chunks[-1]["output_ids"]) < 900


def _send_raw(url: str, body: dict) -> socket.socket:
    """An HTTP request on a bare socket, so the test decides exactly when the client goes away."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /generate HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port.encode(), len(data), data)
    )
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_of_a_running_request_frees_the_slot_even_while_paused(url, stream):
    sock = _send_raw(url, {"text": PROMPTS[3], "stream": stream, "sampling_params": greedy(900)})
    try:
        assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 1)
        # no chunk is due from now on
        assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}).status_code == 200
        if stream:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.close()
        assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 0)
    finally:
        sock.close()
        httpx.post(f"{url}/continue_generation")
    assert gen(url, text="ok", sampling_params=greedy(2))["meta_info"]["completion_tokens"] == 2


def test_pause_holds_requests_and_continue_releases_them(url):
    assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}).json()["status"] == "ok"
    box = {}
    t = threading.Thread(target=lambda: box.update(out=gen(url, text=PROMPTS[0], sampling_params=greedy(4))))
    t.start()
    assert wait_until(lambda: server_stats(url)["num_queue_reqs"] == 1)
    assert "out" not in box and server_stats(url)["paused"] is True
    assert httpx.post(f"{url}/continue_generation").json()["status"] == "ok"
    t.join(60)
    assert box["out"]["meta_info"]["completion_tokens"] == 4


def test_disconnect_while_queued_behind_a_pause_drops_the_request(url):
    assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}).status_code == 200
    try:
        for stream in (True, False):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    f"{url}/generate",
                    json={"text": PROMPTS[1], "stream": stream, "sampling_params": greedy(5)},
                    timeout=httpx.Timeout(60, read=0.5),
                )
            assert wait_until(lambda: server_stats(url)["num_queue_reqs"] == 0)
    finally:
        httpx.post(f"{url}/continue_generation")
    assert server_stats(url)["num_running_reqs"] == 0


def test_info_health_flush_and_metrics(url):
    info = httpx.get(f"{url}/model_info").json()
    assert info["model_path"] and info["weight_version"] and "draft_weight_version" in info
    assert httpx.get(f"{url}/get_model_info").json()["model_path"] == info["model_path"]
    server = httpx.get(f"{url}/server_info").json()
    assert "avg_spec_accept_length" in server["internal_states"][0]
    assert "api_key" not in server and "admin_api_key" not in server
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/health_generate", timeout=60).status_code == 200
    assert httpx.post(f"{url}/flush_cache").status_code == 200
    text = httpx.get(f"{url}/metrics").text
    for name in (
        "gleanrl:num_running_reqs",
        "gleanrl:num_queue_reqs",
        "gleanrl:generation_tokens_total",
        "gleanrl:time_to_first_token_seconds_bucket",
        "gleanrl:e2e_request_latency_seconds_count",
    ):
        assert name in text, name
    tokens = next(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("gleanrl:generation_tokens_total")
    )
    assert tokens >= 12
