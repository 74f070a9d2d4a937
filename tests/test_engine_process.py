"""The engine in a process of its own (`server/engine/remote.py`, `gleanrl serve`'s default; issue 39): the same
answers over HTTP as the embedded engine (greedy, seeded samples, n > 1, stop strings, logprobs of prompt and output),
a stream whose client leaves aborted in the child, tensor and disk weight updates through the socket pair; and the
ends of either process: a child that dies fails requests with 503 and stops the server, a child that cannot load
says why in one line, and `gleanrl serve` killed with -9 leaves no engine process behind. More of the HTTP surface runs
through the child in `test_parity_logprobs`, `test_engine_http_pause`, `test_parity_weights_tensor`,
`test_openai_structured` (its eagle arm), `test_hostile` and `test_hostile_edge`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving import post, running_app, server_stats, wait_until
from test_parity_weights_tensor import by_value, tensors

BODIES = {
    "greedy": {
        "text": "The quick brown fox",
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
    },
    "seeded n=2": {"text": "Once upon", "sampling_params": {"max_new_tokens": 10, "n": 2, "seed": 7}},
    "batch": {"text": ["a b", "c d e"], "sampling_params": {"max_new_tokens": 6, "temperature": 0}},
    "stop": {"text": "The quick", "sampling_params": {"max_new_tokens": 30, "temperature": 0, "stop": ["e"]}},
    "logprobs": {
        "text": "The quick brown fox",
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 3,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0},
    },
}


def _comparable(answer) -> list:
    """What must not depend on where the engine runs (ids and timings do)."""
    keep = ("prompt_tokens", "completion_tokens", "finish_reason", "weight_version", "output_token_logprobs")
    keep += ("input_token_logprobs", "output_top_logprobs", "input_top_logprobs")
    items = answer if isinstance(answer, list) else [answer]
    return [(a["text"], a["output_ids"], {k: a["meta_info"].get(k) for k in keep}) for a in items]


@pytest.fixture(scope="module")
def both(tiny_qwen2):
    with running_app(tiny_qwen2) as (embedded, _), running_app(tiny_qwen2, engine_process=True) as (child, app):
        assert app.state.engine.proc.poll() is None  # the engine really is another process
        yield embedded, child


@pytest.mark.parametrize("name", list(BODIES))
def test_the_same_answers_as_the_embedded_engine(both, name):
    embedded, child = (post(url, "/generate", BODIES[name]) for url in both)
    assert embedded.status_code == child.status_code == 200, child.text
    assert _comparable(child.json()) == _comparable(embedded.json())


def test_refusals_cross_the_process_with_their_message(both, tmp_path):
    _, child = both
    before = post(child, "/generate", BODIES["greedy"]).json()
    r = post(child, "/update_weights_from_disk", {"model_path": str(tmp_path / "missing")})
    assert r.status_code == 400 and "missing" in r.text and not r.json()["success"]  # the child's CheckpointError
    after = post(child, "/generate", BODIES["greedy"]).json()
    assert _comparable(after) == _comparable(before)


def test_a_stream_left_by_its_client_is_aborted_in_the_child(both):
    _, child = both
    tokens = server_stats(child)["generation_tokens_total"]
    body = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    with httpx.stream("POST", f"{child}/generate", json=body, timeout=60) as r:
        assert any(line.startswith("data: {") for line in r.iter_lines())  # it streams; then the client leaves
    assert wait_until(lambda: server_stats(child)["num_running_reqs"] == 0, timeout=60)
    stats = server_stats(child)
    assert stats["num_queue_reqs"] == 0 and stats["generation_tokens_total"] - tokens < 1000


def test_tensor_and_disk_updates_reach_the_child(both, tiny_qwen2, tiny_qwen2_b):
    embedded, child = both
    greedy = BODIES["greedy"]
    before = post(child, "/generate", greedy).json()["output_ids"]
    named = tensors(tiny_qwen2_b)
    bad = {"serialized_named_tensors": [by_value([(named[0][0], named[0][1][:1])])]}
    r = post(child, "/update_weights_from_tensor", bad)
    assert r.status_code == 400 and named[0][0] in r.text
    update = {"serialized_named_tensors": [by_value(named)], "weight_version": "b"}
    for url in both:
        assert post(url, "/update_weights_from_tensor", update).json()["success"]
    after = [post(url, "/generate", greedy).json() for url in both]
    assert after[1]["output_ids"] == after[0]["output_ids"] != before
    assert after[1]["meta_info"]["weight_version"] == "b"
    for url in both:  # back to the fixture's weights, by disk
        r = post(url, "/update_weights_from_disk", {"model_path": str(tiny_qwen2), "weight_version": "a"})
        assert r.status_code == 200 and r.json()["success"], r.text
    assert post(child, "/generate", greedy).json()["output_ids"] == before
    assert httpx.get(f"{child}/model_info", timeout=30).json()["weight_version"] == "a"


def test_a_child_that_dies_fails_requests_and_stops_the_server(tiny_qwen2):
    from gleanrl.server.config import EngineConfig
    from gleanrl.server.engine import EngineProcess

    stopped = threading.Event()
    engine = EngineProcess(EngineConfig(model_path=str(tiny_qwen2), num_threads=1), on_exit=stopped.set)
    with running_app(tiny_qwen2, engine=engine) as (url, _):
        assert post(url, "/generate", BODIES["greedy"]).status_code == 200
        engine.proc.kill()
        assert stopped.wait(60)
        r = post(url, "/generate", BODIES["greedy"])
        assert r.status_code == 503 and "engine process has exited" in r.json()["error"]["message"]
        assert httpx.get(f"{url}/health", timeout=30).status_code == 503


def test_a_child_that_cannot_load_says_why(tiny_qwen2, tmp_path):
    from gleanrl.server.config import EngineConfig
    from gleanrl.server.engine import EngineGone, EngineProcess

    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen2, broken)
    for f in broken.glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")
    with pytest.raises(EngineGone) as caught:
        EngineProcess(EngineConfig(model_path=str(broken), num_threads=1))
    assert "\n" not in str(caught.value) and "Error" in str(caught.value)


def _children(pid: int) -> list[int]:
    return [int(k) for t in Path(f"/proc/{pid}/task").glob("*/children") for k in t.read_text().split()]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_serve_runs_the_engine_apart_and_it_ends_with_the_server(tiny_qwen2, tmp_path):
    from gleanrl.bench.serve_process import free_port, healthy

    port = free_port()
    cmd = [sys.executable, "-m", "gleanrl", "serve", "--model", str(tiny_qwen2), "--threads", "1", "--port", str(port)]
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, TOKENIZERS_PARALLELISM="0"))
    try:
        assert wait_until(lambda: healthy(f"http://127.0.0.1:{port}") or proc.poll() is not None, timeout=300)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
        (engine,) = _children(proc.pid)
        answer = post(f"http://127.0.0.1:{port}", "/generate", BODIES["greedy"]).json()
        assert len(answer["output_ids"]) == 12
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 60
        while not _gone(engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(engine), "the engine process outlived its server"
    finally:
        proc.kill()
        log.close()
