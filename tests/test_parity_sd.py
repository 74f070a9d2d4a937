"""Penalties, min_new_tokens and logit_bias with speculative decoding on (issue 13, item 3): greedy
output, logprobs and top logprobs identical to plain decoding with a trained drafter (so drafts are
accepted and the window's per-position counts matter), and sampled SD distributed exactly as the
penalised target: tokens 2 and 3 come from verify passes and their exact marginals are computed with
transformers and a plain reading of SGLang's penalties (chi-square as in
test_sd_engine_sampling.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_util import PROMPTS, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import EngineState
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import GenerateRequest, SamplingParams
from gleanrl.server.sampling.sampler import processed_probs
from sd_util import run_seeded, sd_on, trained_drafter
from test_parity_sampling import reference_penalties
from test_sd_engine_sampling import _chi2

NEW, N, BATCH, TOP_K = 32, 4000, 100, 8
PENALISED = [
    dict(repetition_penalty=1.3),
    dict(frequency_penalty=0.6, presence_penalty=0.3),
    dict(presence_penalty=-0.5, logit_bias={11: 1.5}),
    dict(min_new_tokens=NEW // 2, logit_bias={"eos": 8.0}),
]


@pytest.fixture(scope="module")
def drafter(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    return trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path_factory.mktemp("sdpen") / "drafter")


@pytest.fixture(scope="module")
def engines(tiny_qwen2, drafter):
    engs = {
        "plain": Engine(EngineConfig(model_path=str(tiny_qwen2), sd="off")),
        "sd": Engine(EngineConfig(model_path=str(tiny_qwen2), drafter=str(drafter), sd="on")),
        "fused": Engine(
            EngineConfig(
                model_path=str(tiny_qwen2), drafter=str(drafter), sd="on", sd_sources=("eagle", "group", "fused")
            )
        ),
    }
    for e in engs.values():
        e.start()
    yield engs
    for e in engs.values():
        e.shutdown()


def _reqs(tok, extra: dict, tag: str) -> list[GenerateRequest]:
    """With min_new_tokens, a strong bias on EOS: masked until then, it ends each request
    right after."""
    if "min_new_tokens" in extra:
        extra = {**extra, "logit_bias": {tok.eos_token_id: extra["logit_bias"]["eos"]}}
    eos = {"ignore_eos": True} if "min_new_tokens" not in extra else {}
    params = SamplingParams(max_new_tokens=NEW, temperature=0.0, **eos, **extra)
    return [
        GenerateRequest(f"{tag}{i}", tok(p)["input_ids"], params, return_logprob=True, top_logprobs_num=2)
        for i, p in enumerate(PROMPTS[:4])
    ]


def _tops(engine, reqs):
    async def one(r):
        tops = []
        async for out in engine.generate(r):
            tops += out.new_top_logprobs
        return tops

    import asyncio

    async def main():
        return await asyncio.gather(*(one(r) for r in reqs))

    return asyncio.run(main())


@pytest.mark.parametrize("extra", PENALISED, ids=["rep", "freq-pres", "pres-bias", "min-new"])
def test_penalised_greedy_identical_with_sd(engines, tiny_tokenizer, extra):
    plain = run_all(engines["plain"], _reqs(tiny_tokenizer, extra, "p"))
    sd = run_all(engines["sd"], _reqs(tiny_tokenizer, extra, "s"))
    free = run_all(engines["plain"], _reqs(tiny_tokenizer, {}, "f"))
    # the processing changes the output
    assert any(a["ids"] != f["ids"] for a, f in zip(plain, free))
    if "min_new_tokens" in extra:
        assert all(len(a["ids"]) == NEW // 2 + 1 and a["finish_reason"]["type"] == "stop" for a in plain)
    for a, b in zip(plain, sd):
        assert b["ids"] == a["ids"] and b["finish_reason"] == a["finish_reason"]
        assert b["logprobs"] == pytest.approx(a["logprobs"], abs=1e-4)
        assert b["out"].spec_verify_ct > 0
    # drafts were accepted: window rows j >= 1 used
    assert sum(r["out"].spec_accept_token_num for r in sd) >= 4
    tops_plain, tops_sd = (
        _tops(engines["plain"], _reqs(tiny_tokenizer, extra, "tp")),
        _tops(engines["sd"], _reqs(tiny_tokenizer, extra, "ts")),
    )
    for a, b in zip(tops_plain, tops_sd):
        assert len(a) == len(b) == NEW or "min_new_tokens" in extra
        assert [[t for _, t in row] for row in a] == [[t for _, t in row] for row in b]
    for _ in range(2):
        # group drafts: siblings and earlier samples of the same prompts are in the index by now
        fused = run_all(engines["fused"], _reqs(tiny_tokenizer, extra, "g"))
        assert [r["ids"] for r in fused] == [a["ids"] for a in plain]
        assert [r["logprobs"] for r in fused] == [pytest.approx(a["logprobs"], abs=1e-4) for a in plain]
        # trees verify penalised requests too
        assert all(r["out"].spec_verify_ct > 0 for r in fused)
    tops_fused = _tops(engines["fused"], _reqs(tiny_tokenizer, extra, "tg"))
    for a, b in zip(tops_plain, tops_fused):
        assert [[t for _, t in row] for row in a] == [[t for _, t in row] for row in b]
    assert engines["fused"].decoder.counters.spec_accept_token_num_by_source["group"] > 0


SAMPLED = SamplingParams(
    max_new_tokens=4,
    temperature=1.0,
    top_k=TOP_K,
    ignore_eos=True,
    frequency_penalty=0.9,
    presence_penalty=0.6,
    repetition_penalty=1.2,
    logit_bias={11: 0.8},
)


def _probs(model, prompt: list[int], out: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, -1].tolist()
    row = torch.tensor([reference_penalties(logits, out, SAMPLED, set())])
    one = torch.ones(1)
    return processed_probs(row, one, torch.tensor([TOP_K]), one, torch.zeros(1))[0]


def _marginals(model, prompt: list[int]) -> tuple[dict[int, float], dict[int, float]]:
    p1 = _probs(model, prompt, [])
    m2: Counter = Counter()
    m3: Counter = Counter()
    for t1 in p1.nonzero()[:, 0].tolist():
        p2 = _probs(model, prompt, [t1])
        for t2 in p2.nonzero()[:, 0].tolist():
            w = float(p1[t1] * p2[t2])
            m2[t2] += w
            for t3, q in enumerate(_probs(model, prompt, [t1, t2]).tolist()):
                if q > 0:
                    m3[t3] += w * q
    return m2, m3


def test_sampled_penalised_sd_follows_the_penalised_target(tiny_qwen2, tiny_tokenizer, drafter):
    runner = ModelRunner.load(str(tiny_qwen2))
    spec = sd_on(runner, drafter)
    prompt = tiny_tokenizer("The quick brown fox")["input_ids"]
    outputs = run_seeded(Scheduler(EngineState(), runner, BATCH), spec, prompt, SAMPLED, N)
    assert len(outputs) == N and spec.counters.verify_ct > 0
    assert 1.2 < spec.stats()["avg_spec_accept_length"] < 3.8  # both accepts and rejections happen
    m2, m3 = _marginals(AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval(), prompt)
    for pos, exact in ((1, m2), (2, m3)):
        stat, threshold = _chi2(Counter(o[pos] for o in outputs), exact, N)
        assert stat < threshold, f"token {pos + 1}: chi-square {stat:.1f} >= {threshold:.1f}"
