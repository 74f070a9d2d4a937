"""Prompt logprobs scored inside the request's own prefill (issue 39: no second forward over the prompt beside the
decode thread): fed once, in chunks of SCORE_CHUNK, the scores as transformers computes them; a prefix fed again
before the scores are complete is scored again from the start."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_util import req
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.protocol import GenerateRequest, SamplingParams
from gleanrl.server.sampling.prompt_scores import SCORE_CHUNK, PromptScores


@pytest.fixture(scope="module")
def engine(tiny_qwen2):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), max_running_requests=4, sd="off"))
    eng.start()
    yield eng
    eng.shutdown()


def outputs(engine, request: GenerateRequest) -> list:
    async def main():
        return [out async for out in engine.generate(request)]

    return asyncio.run(main())


def test_a_long_prompt_is_scored_in_its_one_prefill(engine, tiny_qwen2, monkeypatch):
    runner = engine.scheduler.runner
    ids = torch.randint(3, runner.vocab_size, (SCORE_CHUNK + 188,), generator=torch.Generator().manual_seed(0)).tolist()
    fed, forward = [], runner.forward
    monkeypatch.setattr(
        runner, "forward", lambda token_ids, *a, **k: fed.append(len(token_ids)) or forward(token_ids, *a, **k)
    )
    r = req(ids, max_new_tokens=3, ignore_eos=True)
    r.logprob_start_len, r.top_logprobs_num, r.token_ids_logprob = 100, 2, [5, 9]
    outs = outputs(engine, r)
    # the prompt went through the model once, in two chunks, then one token per decode step
    assert fed == [SCORE_CHUNK, 188, 1, 1]
    records = [o.prompt_logprobs for o in outs if o.prompt_logprobs is not None]
    assert len(records) == 1 and outs[0].prompt_logprobs is records[0]  # with the first update, once
    got = records[0].as_lists(ids, [5, 9])
    with torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)  # row p: log p(. | ids[: p + 1])
    assert got["token"][0] == (None, ids[100]) and [t for _, t in got["token"]] == ids[100:]
    want = ref[100:-1].gather(1, torch.tensor(ids[101:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor([lp for lp, _ in got["token"][1:]]), want, atol=1e-4)
    assert got["top"][0] is None and len(got["top"]) == len(ids) - 100
    for row, dist in zip(got["top"][1:] + [got["next_top"]], ref[100:]):
        assert [t for _, t in row] == dist.topk(2).indices.tolist()
    assert torch.allclose(torch.tensor([[v for v, _ in r] for r in got["ids"][1:]]), ref[100:-1][:, [5, 9]], atol=1e-4)
    assert [t for _, t in got["next_ids"]] == [5, 9]


def test_a_scoring_request_with_no_new_tokens_runs_and_samples_nothing(engine):
    ids = list(range(3, 40))
    r = req(ids, max_new_tokens=0)
    r.logprob_start_len, r.token_ids_logprob = len(ids), [7]
    outs = outputs(engine, r)
    assert [o.new_ids for o in outs] == [[]] and outs[-1].finish_reason == {"type": "length", "length": 0}
    got = outs[-1].prompt_logprobs.as_lists(ids, [7])
    assert got["token"] == [] and [t for _, t in got["next_ids"]] == [7] and got["next_ids"][0][0] < 0
    plain = outputs(engine, req(ids, max_new_tokens=0))  # nothing asked: finished at once, no record
    assert plain[-1].prompt_logprobs is None and plain[-1].finish_reason == {"type": "length", "length": 0}


def test_a_prefix_fed_again_is_scored_again_from_the_start():
    params = SamplingParams(max_new_tokens=1)
    scores = PromptScores.of(GenerateRequest("x", list(range(10)), params, True, 2, 1))
    span = scores.positions(0, 6)
    assert span == range(2, 6)
    scores.add(torch.randn(4, 16), span)
    assert scores.positions(0, 4) == range(2, 4) and scores.parts == []  # a flush or retraction: from `first` again
    scores.add(torch.randn(2, 16), range(2, 4))
    assert scores.take() is None  # not done
    scores.add(torch.randn(6, 16), scores.positions(4, 6))
    record = scores.take()
    assert record.token.shape == (7,) and record.top_ids.shape == (8, 1) and scores.take() is None
    assert PromptScores.of(GenerateRequest("y", [1, 2], params, True)) is None  # logprob_start_len -1: none asked
