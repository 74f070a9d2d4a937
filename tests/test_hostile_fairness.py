"""Issue 39: what one client asks does not hold the event loop that serves the others. An answer
carrying megabytes of logprobs (top_logprobs_num at its limit over the prompt and the output), whole
or as a stream's chunks, is rendered in a worker thread: while it renders, /health and another
client's request are answered.
The render is held on an event, so what is checked is a state (answered while held), never time."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

import gleanrl.server.http.generate.route as generate
from serving import greedy_ids, running_app

HEAVY = {
    "text": "word " * 200,
    "return_logprob": True,
    "logprob_start_len": 0,
    "top_logprobs_num": 64,
    "sampling_params": {"max_new_tokens": 16, "ignore_eos": True},
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_large_logprob_answer_renders_off_the_event_loop(tiny_qwen2, monkeypatch, stream):
    started, release = threading.Event(), threading.Event()
    real = generate.render

    def held(state, track, sp, text_in_logprobs=False):
        if track.req.top_logprobs_num:
            started.set()
            release.wait(120)
        return real(state, track, sp, text_in_logprobs)

    monkeypatch.setattr(generate, "render", held)
    with running_app(tiny_qwen2) as (url, _app):
        answers = []
        heavy = threading.Thread(
            target=lambda: answers.append(httpx.post(f"{url}/generate", json=HEAVY | {"stream": stream}, timeout=300)),
            daemon=True,
        )
        heavy.start()
        try:
            assert started.wait(120), "the heavy request never reached its render"
            # the loop is free while the heavy answer renders: others are served meanwhile
            assert httpx.get(f"{url}/health", timeout=60).status_code == 200
            assert greedy_ids(url, [5, 6, 7], 4)["output_ids"]
            assert not answers  # still held: the answers above did not wait for it
        finally:
            release.set()
        heavy.join(300)
    r = answers[0]
    assert r.status_code == 200, r.text
    if stream:
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-1:]
        meta = json.loads(events[-2])["meta_info"]
    else:
        meta = r.json()["meta_info"]
    assert len(meta["input_top_logprobs"]) == meta["prompt_tokens"]
    assert all(len(row) == 64 for row in meta["output_top_logprobs"])


def test_serve_takes_its_startup_heap_out_of_the_collectors_reach(tiny_qwen2, monkeypatch):
    """A full collection over the ~350k objects alive after startup stops every thread for ~200 ms
    (the event loop, /health, the engine): `gleanrl serve` freezes them before it serves."""
    import argparse
    import gc

    import uvicorn

    from gleanrl.server import cli

    frozen = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: frozen.append(gc.get_freeze_count()))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_qwen2), "--port", "0", "--threads", "1"])
    try:
        assert cli.run(args) == 0
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] > 0, frozen


def _events(r: httpx.Response) -> list[dict]:
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and lines[-1] == "[DONE]", (r.status_code, lines[-1:])
    return [json.loads(x) for x in lines[:-1]]


def test_a_stream_with_megabytes_of_logprobs_renders_a_bounded_amount_per_token(tiny_qwen2):
    """Each chunk of a /generate stream is cumulative: with the prompt's top-64 logprobs in every
    one, a chunk per token would render the prompt's megabyte once per token. The chunks come less
    often instead, and the last holds everything the whole answer does."""
    tokens = 48
    heavy = HEAVY | {"sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}}
    light = {"text": "word", "stream": True, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
    with running_app(tiny_qwen2) as (url, _app):
        whole = httpx.post(f"{url}/generate", json=heavy, timeout=300).json()
        chunks = _events(httpx.post(f"{url}/generate", json=heavy | {"stream": True}, timeout=300))
        plain = _events(httpx.post(f"{url}/generate", json=light, timeout=300))
    assert len(plain) == tokens  # an ordinary stream: a chunk per token, as before
    assert len(chunks) <= tokens // 4, len(chunks)
    last = chunks[-1]
    assert last["output_ids"] == whole["output_ids"]
    for key in ("input_top_logprobs", "output_top_logprobs", "output_token_logprobs"):
        assert last["meta_info"][key] == whole["meta_info"][key], key
