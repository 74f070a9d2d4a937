"""Stop rules (stop strings, stop ids, EOS, max_new_tokens, context length) and aborts."""

from __future__ import annotations

import asyncio

import pytest

from engine_util import collect, finished_track, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.http.generate.detok import output_text


@pytest.fixture(scope="module")
def engine(tiny_qwen2):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), max_running_requests=2, context_length=64))
    eng.start()
    yield eng
    eng.shutdown()


def _greedy(engine, prompt: str, n: int = 40) -> tuple[list[int], list[int]]:
    ids = engine.tokenizer(prompt)["input_ids"]
    return ids, run_all(engine, [req(ids, max_new_tokens=n, ignore_eos=True)])[0]["ids"]


def test_stop_token_id(engine):
    ids, full = _greedy(engine, "Hello, world!")
    k = next(i for i in range(3, len(full)) if full[i] not in full[:i])  # first new token after 3
    r = run_all(engine, [req(ids, max_new_tokens=40, ignore_eos=True, stop_token_ids=[full[k]])])[0]
    assert r["ids"] == full[: k + 1]
    assert r["finish_reason"] == {"type": "stop", "matched": full[k]}


def test_eos_unless_ignored(engine):
    ids, full = _greedy(engine, "The quick brown fox")
    eos = full[6]  # pretend this token is EOS: stop at its first occurrence, unless ignore_eos
    engine.eos_ids.add(eos)
    try:
        r = run_all(engine, [req(ids, max_new_tokens=40)])[0]
        again = run_all(engine, [req(ids, max_new_tokens=40, ignore_eos=True)])[0]
    finally:
        engine.eos_ids.discard(eos)
    k = full.index(eos)
    assert r["ids"] == full[: k + 1] and r["finish_reason"] == {"type": "stop", "matched": eos}
    assert again["ids"] == full


def test_stop_string_excluded_from_text(engine):
    tok = engine.tokenizer
    ids, full = _greedy(engine, "def add(a, b):")
    text = tok.decode(full, skip_special_tokens=False)
    # a plain-ASCII stop string mid-output
    start = next(
        i for i in range(len(text) // 3, len(text) - 2) if all(c.isascii() and c not in "<|>" for c in text[i : i + 2])
    )
    stop = text[start : start + 2]
    r = run_all(engine, [req(ids, max_new_tokens=40, ignore_eos=True, stop=[stop, "NEVER-SEEN"])])[0]
    assert r["finish_reason"] == {"type": "stop", "matched": stop}
    assert r["ids"] == full[: len(r["ids"])]
    # ids keep the last token
    assert stop in tok.decode(r["ids"]) and stop not in tok.decode(r["ids"][:-1])
    assert output_text(tok, finished_track(r["ids"], stop), skip_special_tokens=False) == text[: text.find(stop)]


def test_max_new_tokens_and_context_length(engine):
    ids = engine.tokenizer("Hello")["input_ids"]
    r = run_all(engine, [req(ids, max_new_tokens=7, ignore_eos=True)])[0]
    assert len(r["ids"]) == 7 and r["finish_reason"] == {"type": "length", "length": 7}
    r = run_all(engine, [req(ids, max_new_tokens=500, ignore_eos=True)])[0]
    assert len(ids) + len(r["ids"]) == 64 and r["finish_reason"]["type"] == "length"
    r = run_all(engine, [req(ids, max_new_tokens=0)])[0]
    assert r["ids"] == [] and r["finish_reason"] == {"type": "length", "length": 0}


def test_abort_frees_slot_and_queue_moves(engine):
    ids = engine.tokenizer("Hello")["input_ids"]
    engine.pause("in_place")  # keep both long requests running and the third waiting while we look
    long_a, long_b = req(ids, max_new_tokens=50, ignore_eos=True), req(ids, max_new_tokens=50, ignore_eos=True)
    short = req(ids, max_new_tokens=5, ignore_eos=True)

    before = engine.stats()["generation_tokens_total"]

    async def main():
        tasks = [asyncio.create_task(collect(engine, r)) for r in (long_a, long_b, short)]
        while engine.stats()["num_queue_reqs"] + engine.stats()["num_running_reqs"] < 3:
            await asyncio.sleep(0.005)
        engine.resume()
        while engine.stats()["generation_tokens_total"] == before:
            await asyncio.sleep(0.005)
        engine.pause("in_place")
        assert engine.stats()["num_running_reqs"] == 2 and engine.stats()["num_queue_reqs"] == 1
        assert engine.abort(long_a.rid) == 1
        assert engine.abort("no-such-rid") == 0
        assert engine.stats()["num_running_reqs"] == 1  # freed at once, even while paused
        engine.resume()
        return await asyncio.gather(*tasks)

    a, b, s = asyncio.run(main())
    assert a["finish_reason"]["type"] == "abort" and len(a["ids"]) < 50
    assert len(b["ids"]) == 50 and len(s["ids"]) == 5
    assert engine.stats()["num_running_reqs"] == 0


def test_consumer_disconnect_aborts(engine):
    ids = engine.tokenizer("Hello")["input_ids"]

    async def main():
        gen = engine.generate(req(ids, max_new_tokens=60, ignore_eos=True))
        await gen.__anext__()
        await gen.aclose()  # what the HTTP edge does when the client goes away
        for _ in range(200):
            if engine.stats()["num_running_reqs"] == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())


def test_abort_all(engine):
    ids = engine.tokenizer("Hello")["input_ids"]

    async def main():
        tasks = [asyncio.create_task(collect(engine, req(ids, max_new_tokens=60, ignore_eos=True))) for _ in range(4)]
        while engine.stats()["num_running_reqs"] < 2:
            await asyncio.sleep(0.005)
        engine.pause("in_place")
        assert engine.abort() == 4
        engine.resume()
        return await asyncio.gather(*tasks)

    assert all(r["finish_reason"]["type"] == "abort" for r in asyncio.run(main()))
    assert engine.stats()["num_running_reqs"] == 0 and engine.stats()["num_queue_reqs"] == 0


def test_shutdown_aborts_running_and_later_requests(tiny_qwen2):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2)))
    eng.start()
    ids = eng.tokenizer("Hello")["input_ids"]

    async def main():
        task = asyncio.create_task(collect(eng, req(ids, max_new_tokens=900, ignore_eos=True)))
        while eng.stats()["generation_tokens_total"] == 0:
            await asyncio.sleep(0.002)
        await asyncio.to_thread(eng.shutdown)
        return await task, await collect(eng, req(ids, max_new_tokens=5))

    running, later = asyncio.run(main())
    assert running["finish_reason"] == {"type": "abort", "message": "Server shutdown"}
    assert later["finish_reason"]["type"] == "abort" and later["ids"] == []
