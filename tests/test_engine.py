"""The embedded engine against transformers: greedy identity, continuous batching,
seeds, logprobs."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_util import PROMPTS, collect, hf_greedy, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_qwen2):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), max_running_requests=32))
    eng.start()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def hf_qwen2(tiny_qwen2):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()


@pytest.mark.parametrize("arch", ["tiny_qwen2", "tiny_llama", "tiny_qwen3"])
def test_greedy_equals_transformers(arch, request):
    path = request.getfixturevalue(arch)
    eng = Engine(EngineConfig(model_path=str(path)))
    eng.start()
    try:
        prompts = [eng.tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
        res = run_all(eng, [req(p, max_new_tokens=24, ignore_eos=True) for p in prompts])
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        for p, r in zip(prompts, res):
            assert r["ids"] == hf_greedy(model, p, 24)
            assert r["finish_reason"] == {"type": "length", "length": 24}
    finally:
        eng.shutdown()


def test_mixed_lengths_concurrent_each_equal_solo_and_short_first(engine, hf_qwen2):
    tok = engine.tokenizer
    lengths = [3, 90, 10, 60, 5, 120, 20, 40, 8, 100, 15, 70, 30, 4, 50, 12]
    prompts = [tok(PROMPTS[i % len(PROMPTS)] * (1 + i % 3))["input_ids"] for i in range(16)]
    reqs = [req(p, max_new_tokens=n, ignore_eos=True) for p, n in zip(prompts, lengths)]
    # as the engine retires them (delivery to the consumers may batch several)
    order: list[str] = []
    emit = engine.scheduler.emit
    engine.scheduler.emit = lambda seq, *a: (emit(seq, *a), seq.finish_reason and order.append(seq.req.rid))

    async def main():  # queue all 16 while paused, so they start decoding in the same iteration
        engine.pause("in_place")
        tasks = [asyncio.create_task(collect(engine, r)) for r in reqs]
        while engine.stats()["num_queue_reqs"] < len(reqs):
            await asyncio.sleep(0.002)
        engine.resume()
        return await asyncio.gather(*tasks)

    try:
        res = asyncio.run(main())
    finally:
        del engine.scheduler.emit
    for p, n, r in zip(prompts, lengths, res):
        assert len(r["ids"]) == n
        assert r["ids"] == hf_greedy(hf_qwen2, p, n)
    assert len(order) == len(reqs)
    finish_len = [lengths[[q.rid for q in reqs].index(rid)] for rid in order]
    assert finish_len == sorted(finish_len), finish_len


def test_short_request_does_not_wait_for_long_one(engine):
    tok = engine.tokenizer

    async def main():
        long_task = asyncio.create_task(
            collect(engine, req(tok("Hello")["input_ids"], max_new_tokens=600, ignore_eos=True))
        )
        while engine.stats()["generation_tokens_total"] == 0 or engine.stats()["num_running_reqs"] == 0:
            await asyncio.sleep(0.005)
        short = await collect(engine, req(tok("Hi")["input_ids"], max_new_tokens=5, ignore_eos=True))
        long_done_first = long_task.done()
        long_res = await long_task
        return short, long_done_first, long_res

    short, long_done_first, long_res = asyncio.run(main())
    assert len(short["ids"]) == 5 and not long_done_first
    assert len(long_res["ids"]) == 600


def test_seed_reproducible_regardless_of_batch(engine):
    tok = engine.tokenizer
    ids = tok("The quick brown fox")["input_ids"]
    solo = run_all(engine, [req(ids, max_new_tokens=30, temperature=1.0, seed=7, ignore_eos=True)])[0]
    others = [req(tok(p)["input_ids"], max_new_tokens=40, temperature=1.0, ignore_eos=True) for p in PROMPTS[:5]]
    batch = run_all(engine, others + [req(ids, max_new_tokens=30, temperature=1.0, seed=7, ignore_eos=True)])[-1]
    other_seed = run_all(engine, [req(ids, max_new_tokens=30, temperature=1.0, seed=8, ignore_eos=True)])[0]
    assert solo["ids"] == batch["ids"]
    assert solo["ids"] != other_seed["ids"]


def test_logprobs_follow_sglang_convention(engine, hf_qwen2):
    tok = engine.tokenizer
    ids = tok("def add(a, b):")["input_ids"]
    for params in ({"temperature": 0.0}, {"temperature": 0.7, "top_p": 0.8, "top_k": 5, "seed": 3}):
        r = run_all(engine, [req(ids, max_new_tokens=12, ignore_eos=True, **params)])[0]
        with torch.no_grad():
            logits = hf_qwen2(torch.tensor([ids + r["ids"]])).logits[0, len(ids) - 1 : -1]
        # temperature applies; top-p and top-k do not (SGLang 0.5.23)
        t = params["temperature"] or 1.0
        expected = torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(r["ids"])[:, None])[:, 0]
        assert torch.allclose(torch.tensor(r["logprobs"]), expected, atol=1e-4)


def test_bad_requests_raise_value_error(engine):
    async def first(r):
        async for _ in engine.generate(r):
            break

    with pytest.raises(ValueError, match="context length"):
        asyncio.run(first(req([5] * engine.context_length, max_new_tokens=1)))
    with pytest.raises(ValueError, match="input_ids"):
        asyncio.run(first(req([10**7], max_new_tokens=1)))
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(first(req([], max_new_tokens=1)))
    assert engine.stats()["num_running_reqs"] == 0 and engine.stats()["num_queue_reqs"] == 0
