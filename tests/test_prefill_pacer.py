"""Prefill paced while requests decode (issue 39: a benign request's latency must not depend on the prompts another
client sends): the budget from measured costs, prefill's share of the time held to `share` over many iterations, and
in the engine a long prompt prefilled in small chunks between the running request's decode-only iterations, its
output unchanged."""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine_util import collect, req
from gleanrl.server.config import EngineConfig
from gleanrl.server.decode.iteration import PROBE, STALL, PrefillPacer
from gleanrl.server.engine import Engine


def test_paced_chunks_while_nothing_decodes_and_measured_before_paced():
    p = PrefillPacer(share=0.33, chunk=1024)
    assert p.budget(decoding=False) == (1024, 0)  # nothing measured yet: whole chunks
    assert p.budget(decoding=True) == (0, 0)  # a decode-only iteration measures first
    p.record(decoding=True, prefilled=0, seconds=0.001)  # 1 ms
    assert p.budget(decoding=True) == (PROBE, 0)  # then a small chunk measures prefill
    p.record(decoding=False, prefilled=1000, seconds=0.1)  # a prefill-only iteration: 0.1 ms a token
    paced = round(STALL * 0.001 / 0.0001)  # STALL decode iterations' time
    assert p.budget(decoding=True) == (paced, paced)
    p.record(decoding=True, prefilled=paced, seconds=0.005)  # overdrawn: paced while requests decode...
    assert p.budget(decoding=True) == (0, paced)
    assert p.budget(decoding=False) == (paced, paced)  # ...every iteration when none does, in paced chunks
    assert PrefillPacer(share=1.0, chunk=1024).budget(decoding=True) == (1024, 0)


def test_an_overdrawn_prefill_waits_for_decode_only_iterations():
    p = PrefillPacer(share=1 / 3, chunk=1024)
    p.record(False, 1000, 0.1)
    p.record(True, 0, 0.001)
    p.record(True, 40, 0.005)  # a paced chunk: 4 ms of prefill beside the 1 ms decode, which earns 0.5 ms back
    waits = 0
    while p.budget(decoding=True)[0] == 0:
        p.record(True, 0, 0.001)  # decoding earns share / (1 - share) of its time: 0.5 ms an iteration
        waits += 1
    assert waits == 7  # 3.5 ms overdrawn; meanwhile a prompt that fits in one paced chunk is fed whole


def test_prefill_takes_its_share_of_the_time_while_requests_decode():
    """A simulated engine with a prefill backlog: decode 2 ms an iteration, prefill 0.05 ms a token."""
    for share in (0.2, 1 / 3, 0.5):
        p, prefill_s, total_s = PrefillPacer(share=share, chunk=1024), 0.0, 0.0
        p.record(False, 1024, 1024 * 5e-5)
        for _ in range(2000):
            tokens = p.budget(decoding=True)[0]
            seconds = 0.002 + tokens * 5e-5
            p.record(True, tokens, seconds)
            prefill_s, total_s = prefill_s + tokens * 5e-5, total_s + seconds
        assert prefill_s / total_s == pytest.approx(share, abs=0.04)


@pytest.mark.parametrize("share", [1 / 3, 1.0])
def test_a_long_prompt_arriving_while_a_request_decodes(tiny_qwen2, monkeypatch, share):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), sd="off", prefill_share=share))
    eng.start()
    try:
        runner, sizes = eng.scheduler.runner, []
        forward = runner.forward
        monkeypatch.setattr(runner, "forward", lambda ids, *a, **k: sizes.append(len(ids)) or forward(ids, *a, **k))
        long_prompt = torch.randint(3, runner.vocab_size, (900,), generator=torch.Generator().manual_seed(0)).tolist()

        async def main():
            running = asyncio.ensure_future(collect(eng, req([5, 6, 7], max_new_tokens=300, ignore_eos=True)))
            while len(sizes) < 5:  # decoding
                await asyncio.sleep(0.001)
            out = await collect(eng, req(long_prompt, max_new_tokens=4, ignore_eos=True))
            return out, await running

        out, _ = asyncio.run(main())
        during = list(sizes)  # the forwards while the request decoded and the long prompt ran beside it
        alone = asyncio.run(collect(eng, req(long_prompt, max_new_tokens=4, ignore_eos=True)))
    finally:
        eng.shutdown()
    assert out["ids"] == alone["ids"] and out["logprobs"] == pytest.approx(alone["logprobs"], abs=1e-5)
    mixed = [n for n in during if n > 2]  # iterations that prefilled beside the running request
    if share < 1:  # in chunks, with decode-only iterations between them
        assert len(mixed) >= 3 and max(mixed) < 900 and during.count(1) > len(mixed)
    else:  # one chunk of it all
        assert 901 in during


def test_short_prompts_are_fed_whole_while_a_long_one_repays():
    from types import SimpleNamespace

    from gleanrl.server.sampling.sequence import feed_counts

    def seq(pending: int):
        return SimpleNamespace(total_len=1000, cache=SimpleNamespace(length=1000 - pending), scoring=False)

    long_, short, decoding = seq(900), seq(5), seq(1)
    assert feed_counts([long_, short, decoding], 0, 100) == [0, 5, 1]  # overdrawn: the long prompt waits
    assert feed_counts([long_, short, decoding], 50, 100) == [50, 5, 1]
    assert feed_counts([seq(60), seq(60), long_], 0, 100) == [60, 0, 0]  # short ones share one paced chunk
    assert feed_counts([long_, short], 1024) == [900, 5]  # unpaced
