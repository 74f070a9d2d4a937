"""SGLang's pause modes and update lock in the engine: `abort` ends in-flight requests with their
partial output, `retract` requeues them and rebuilds their KV, `in_place` holds them; a target
update without a pause waits for running requests (later ones wait for it), and one under a pause
says per segment which version produced which tokens."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoModelForCausalLM

from engine_util import collect, hf_greedy, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.sampling.sequence import SequenceStatus

LONG = 300


@pytest.fixture()
def engine(tiny_qwen2):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2)))
    eng.start()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_qwen2):
    """Greedy LONG tokens of the prompt, from an engine nobody pauses."""
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2)))
    eng.start()
    try:
        ids = eng.tokenizer("The quick brown fox")["input_ids"]
        return ids, run_all(eng, [req(ids, max_new_tokens=LONG, ignore_eos=True)])[0]["ids"]
    finally:
        eng.shutdown()


async def _started(engine, ids, n=LONG) -> asyncio.Task:
    task = asyncio.create_task(collect(engine, req(ids, max_new_tokens=n, ignore_eos=True)))
    while engine.stats()["generation_tokens_total"] < 5:
        await asyncio.sleep(0.002)
    return task


def test_abort_mode_returns_partial_output_at_once_and_holds_new_requests(engine, reference):
    ids, ref = reference

    async def main():
        task = await _started(engine, ids)
        count = await asyncio.to_thread(engine.pause, "abort")
        aborted = await asyncio.wait_for(task, 30)
        flushed = engine.flush_cache()
        later = asyncio.create_task(collect(engine, req(ids, max_new_tokens=4, ignore_eos=True)))
        while engine.stats()["num_queue_reqs"] == 0:
            await asyncio.sleep(0.002)
        # queued behind the pause, as SGLang's tokenizer side
        held = not later.done() and engine.flush_cache()
        engine.resume()
        return count, aborted, flushed, held, await later

    count, aborted, flushed, held, later = asyncio.run(main())
    k = len(aborted["ids"])
    assert count == 1 and aborted["finish_reason"]["type"] == "abort"
    assert 0 < k < LONG and aborted["ids"] == ref[:k] and len(aborted["logprobs"]) == k
    assert flushed and held and later["ids"] == ref[:4]


def test_retract_mode_requeues_and_rebuilds_the_kv_from_the_prefix(engine, reference):
    ids, ref = reference

    async def main():
        task = await _started(engine, ids)
        assert [s.status for s in engine.state.running] == [SequenceStatus.RUNNING]
        count = await asyncio.to_thread(engine.pause, "retract")
        stats, flushed = engine.stats(), engine.flush_cache()
        seq = engine.state.waiting[0]
        done_before, cache, status = len(seq.output_ids), seq.cache, seq.status
        engine.resume()
        return count, stats, flushed, done_before, cache, status, seq, await task

    count, stats, flushed, done_before, cache, status, seq, res = asyncio.run(main())
    assert status is SequenceStatus.WAITING and seq.status is SequenceStatus.FINISHED
    assert count == 1 and stats["num_running_reqs"] == 0 and stats["num_queue_reqs"] == 1
    assert flushed and cache is None and 0 < done_before < LONG
    assert res["ids"] == ref and res["finish_reason"] == {"type": "length", "length": LONG}
    assert res["out"].meta_info()["num_retractions"] == 1


def test_in_place_mode_holds_and_flush_is_refused(engine, reference):
    ids, ref = reference

    async def main():
        task = await _started(engine, ids)
        count = await asyncio.to_thread(engine.pause, "in_place")
        stats, flushed = engine.stats(), engine.flush_cache()
        engine.resume()
        return count, stats, flushed, await task

    count, stats, flushed, res = asyncio.run(main())
    assert count == 0 and stats["num_running_reqs"] == 1 and stats["paused"] is True
    assert not flushed and res["ids"] == ref
    with pytest.raises(ValueError, match="mode"):
        engine.pause("bogus")


def test_target_update_waits_for_running_requests(engine, reference, tiny_qwen2_b):
    ids, ref = reference

    async def main():
        task = await _started(engine, ids)
        update = asyncio.create_task(asyncio.to_thread(engine.update_weights, str(tiny_qwen2_b), "v2"))
        while engine.state.swap is None:
            await asyncio.sleep(0.002)
        later = asyncio.create_task(collect(engine, req(ids, max_new_tokens=8, ignore_eos=True)))
        while engine.stats()["num_queue_reqs"] == 0:
            await asyncio.sleep(0.002)
        waited = not update.done() and not later.done()
        first = await task
        await update
        return waited, first, await later

    waited, first, later = asyncio.run(main())
    assert waited
    assert first["ids"] == ref and first["out"].weight_version == "default"
    assert first["out"].weight_versions == [{"version": "default", "start": 0, "end": LONG}]
    model_b = AutoModelForCausalLM.from_pretrained(tiny_qwen2_b).eval()
    assert later["ids"] == hf_greedy(model_b, ids, 8) and later["out"].weight_version == "v2"


def test_update_under_retract_rebuilds_under_new_weights_and_reports_segments(engine, reference, tiny_qwen2_b):
    ids, ref = reference

    async def main():
        task = await _started(engine, ids)
        await asyncio.to_thread(engine.pause, "retract")
        k = len(engine.state.waiting[0].output_ids)
        # lands at once: paused
        await asyncio.to_thread(engine.update_weights, str(tiny_qwen2_b), "v2")
        engine.resume()
        return k, await task

    k, res = asyncio.run(main())
    model_b = AutoModelForCausalLM.from_pretrained(tiny_qwen2_b).eval()
    assert res["ids"][:k] == ref[:k] and len(res["ids"]) == LONG
    # transformers as the reference over a short stretch: a near-tie late in a long one may
    # flip the argmax
    assert res["ids"][k : k + 24] == hf_greedy(model_b, ids + ref[:k], 24)
    assert res["out"].weight_versions == [
        {"version": "default", "start": 0, "end": k},
        {"version": "v2", "start": k, "end": LONG},
    ]
    assert res["out"].meta_info()["weight_versions"] == res["out"].weight_versions


def test_abort_all_requests_lets_the_update_through_at_once(engine, reference, tiny_qwen2_b):
    ids, _ = reference

    async def main():
        # ~1000 tokens outlast loading a tiny target by far
        task = await _started(engine, ids, n=1000)
        await asyncio.to_thread(engine.update_weights, str(tiny_qwen2_b), "v2", abort_all_requests=True)
        return await asyncio.wait_for(task, 30)

    res = asyncio.run(main())
    assert res["finish_reason"]["type"] == "abort" and engine.info()["weight_version"] == "v2"
