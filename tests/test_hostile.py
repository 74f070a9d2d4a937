"""Issue 22: no single request can stop, stall or poison the server. Every hostile class
(`tests/hostile_cases.py`) is sent to a real server on a loopback port, with no key set (the
default), while a benign client streams greedy requests: each hostile request gets its clear 4xx/503
or is served within bounds, the benign client sees no error and the same tokens, `/health` answers
200 throughout, and the same weights serve after (its p99 against its baseline and the worst
`/health` are printed; `gleanrl bench load --hostile` measures them on a quiet machine). Then the
engine-side guarantees: a request that fails inside the engine aborts alone, a swap that fails is
undone, a drain is bounded; and the proxy's limits."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from hostile_cases import LIMITS, cases
from serving import greedy_ids, running_app, server_stats, wait_until

BENIGN = {
    "text": "The quick brown fox",
    "stream": True,
    "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
}
ROUND_REQUESTS = 30


class Benign(threading.Thread):
    """Streams BENIGN requests back to back; records latencies and anything but the
    reference answer."""

    def __init__(self, url: str, reference: list[int], count: int):
        super().__init__(daemon=True)
        self.url, self.reference, self.count = url, reference, count
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        with httpx.Client(timeout=120) as http:
            for _ in range(self.count):
                t0, last = time.perf_counter(), {}
                try:
                    with http.stream("POST", f"{self.url}/generate", json=BENIGN) as r:
                        if r.status_code != 200:
                            self.errors.append(f"status {r.status_code}")
                            continue
                        for line in r.iter_lines():
                            if line.startswith("data: {"):
                                last = json.loads(line[6:])
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                    continue
                self.latencies.append(time.perf_counter() - t0)
                if last.get("output_ids") != self.reference:
                    self.errors.append(f"wrong answer: {str(last)[:200]}")


class Health(threading.Thread):
    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.worst, self.failed = url, threading.Event(), 0.0, []

    def run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                status = http.get(f"{self.url}/health").status_code
                self.worst = max(self.worst, time.perf_counter() - t0)
                if status != 200:
                    self.failed.append(status)
                time.sleep(0.05)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _baseline(url: str, reference: list[int]) -> float:
    alone = Benign(url, reference, ROUND_REQUESTS)
    alone.run()
    assert not alone.errors, alone.errors[:3]
    return p99(alone.latencies)


def _hostile_round(url: str, reference: list[int], vocab: int) -> tuple[float, float, list[str]]:
    """Every hostile case once while the benign client streams; returns (benign p99, worst
    /health, wrong)."""
    benign, health, wrong, hostile = Benign(url, reference, ROUND_REQUESTS), Health(url), [], cases(vocab)
    health.start()
    benign.start()
    with httpx.Client(timeout=120) as http:
        while benign.is_alive():
            for name, send, check in hostile:
                why = check(send(http, url))
                if why:
                    wrong.append(f"{name}: {why}")
    benign.join()
    health.stop.set()
    health.join()
    assert not benign.errors, benign.errors[:3]
    assert not health.failed, health.failed
    return p99(benign.latencies), health.worst, wrong


@pytest.mark.parametrize("engine_process", [False, True], ids=["embedded", "engine_process"])
def test_hostile_requests_do_not_stop_stall_or_poison_the_server(tiny_qwen2, engine_process):
    with running_app(tiny_qwen2, engine_process=engine_process, **LIMITS) as (url, app):
        vocab = app.state.vocab_size
        prompt = app.state.tokenizer.encode("Once upon a time")
        before = greedy_ids(url, prompt, 12)
        reference = greedy_ids(url, app.state.tokenizer.encode(BENIGN["text"]), 8)["output_ids"]
        with httpx.Client(timeout=120) as http:
            # warm every path first: first-call costs are not load
            wrong = [f"{name}: {why}" for name, send, check in cases(vocab) if (why := check(send(http, url)))]
        assert not wrong, wrong
        base = _baseline(url, reference)
        loaded, worst_health, wrong = _hostile_round(url, reference, vocab)
        assert not wrong, wrong
        # latency is a figure, not a verdict here (`gleanrl bench load --hostile` tracks it)
        print(f"hostile: benign p99 / baseline p99 {loaded / base:.2f}, worst /health {worst_health * 1000:.0f} ms")
        assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 0 == server_stats(url)["num_queue_reqs"])
        after = greedy_ids(url, prompt, 12)
        assert after["output_ids"] == before["output_ids"]
        assert after["meta_info"]["weight_version"] == before["meta_info"]["weight_version"]
        assert httpx.post(f"{url}/continue_generation", timeout=30).status_code == 200


@pytest.fixture(scope="module")
def served(tiny_qwen2):
    with running_app(tiny_qwen2, max_running_requests=4) as (url, app):
        yield url, app


def test_a_request_failing_inside_the_engine_aborts_alone(served, tok):
    url, app = served
    engine, ids = app.state.engine, tok.encode("Once upon a time")
    want = greedy_ids(url, ids, 400)["output_ids"]
    original = engine.scheduler.step

    def poisoned(decoder, seqs=None):  # the request with rid "poison" breaks every step it is in
        if any(s.req.rid == "poison" for s in (engine.state.running if seqs is None else seqs)):
            raise FloatingPointError("NaN probabilities")
        return original(decoder, seqs)

    engine.scheduler.step = poisoned
    results: list[dict] = []
    good = threading.Thread(target=lambda: results.append(greedy_ids(url, ids, 400)))
    try:
        good.start()
        # then the poison joins its batch
        assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 1)
        bad = httpx.post(
            f"{url}/generate",
            json={"input_ids": ids, "rid": "poison", "sampling_params": {"max_new_tokens": 40}},
            timeout=120,
        ).json()
        good.join()
    finally:
        engine.scheduler.step = original
    assert bad["meta_info"]["finish_reason"]["type"] == "abort"
    assert "NaN probabilities" in bad["meta_info"]["finish_reason"]["message"]
    assert results[0]["output_ids"] == want and results[0]["meta_info"]["finish_reason"]["type"] == "length"


def test_a_swap_that_fails_is_undone_and_the_engine_lives(served, tok, tiny_qwen2_b):
    url, app = served
    engine, ids = app.state.engine, tok.encode("Once upon a time")
    before = greedy_ids(url, ids)
    original = engine.scheduler.rebuild_caches
    calls = []

    def fails_once():
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("no room for the new caches")
        original()

    engine.scheduler.rebuild_caches = fails_once
    try:
        r = httpx.post(
            f"{url}/update_weights_from_disk",
            json={"model_path": str(tiny_qwen2_b), "weight_version": "b"},
            timeout=120,
        )
    finally:
        engine.scheduler.rebuild_caches = original
    assert r.status_code == 400 and "undone" in r.json()["message"] and "no room" in r.json()["message"]
    after = greedy_ids(url, ids)
    assert after["output_ids"] == before["output_ids"] and after["meta_info"]["weight_version"] == "default"
    assert engine.loop.thread.is_alive()


def test_a_drain_that_does_not_end_is_refused_in_bounded_time(tiny_qwen2, tiny_qwen2_b, tok):
    with running_app(tiny_qwen2, swap_timeout_s=0.3) as (url, app):
        ids = tok.encode("Once upon a time")
        long = threading.Thread(
            target=lambda: httpx.post(
                f"{url}/generate",
                json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1000 - len(ids), "ignore_eos": True}},
                timeout=600,
            )
        )
        long.start()
        assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 1)
        r = httpx.post(f"{url}/update_weights_from_disk", json={"model_path": str(tiny_qwen2_b)}, timeout=120)
        assert r.status_code == 400 and "withdrawn" in r.json()["message"]
        # held requests run again
        assert greedy_ids(url, ids, 4)["meta_info"]["weight_version"] == "default"
        app.state.engine.abort(None)
        long.join()


def test_the_proxy_bounds_bodies_and_outputs_and_keys_its_feed(served):
    from proxy_util import running_proxy

    url, _ = served
    with running_proxy(url, max_request_bytes=4096, max_outputs=16) as (px, _app):
        big = httpx.post(f"{px}/generate", json={"text": "x" * 8000}, timeout=30)
        assert big.status_code == 413
        many = httpx.post(f"{px}/generate", json={"text": "a", "sampling_params": {"n": 10**9}}, timeout=30)
        assert many.status_code == 400 and "sampling_params.n" in many.json()["error"]["message"]
        feed = httpx.get(f"{px}/harvest_feed", timeout=30)
        assert feed.status_code == 404 and "--admin-api-key" in feed.json()["error"]["message"]
        assert (
            httpx.post(
                f"{px}/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 2}}, timeout=60
            ).status_code
            == 200
        )


def test_non_loopback_bind_and_keyless_feed_are_refused():
    from gleanrl.server.http.config import ServerConfig

    with pytest.raises(ValueError, match="admin-api-key"):
        ServerConfig(host="0.0.0.0")
    with pytest.raises(ValueError, match="harvest-feed"):
        ServerConfig(harvest_feed=True)
    assert ServerConfig(host="0.0.0.0", admin_api_key="k").host == "0.0.0.0"
    assert ServerConfig(host="::1").host == "::1"


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "127.0.0.1"])
def test_loopback_host_headers_are_accepted(served, host):
    url, _ = served
    assert httpx.get(f"{url}/health", headers={"host": host}, timeout=30).status_code == 200
