"""Sampled SD through the real decode step follows the target's distribution.

`test_speculative.py` checks the acceptance rule in isolation; this checks its wiring in the
engine's SD step (draft distributions q stored for the right tokens, target p taken at the right
verify positions, caches rolled back): 4,000 sequences, temperature 1 with top-k 8, drafted by a
trained drafter (so both acceptances and residual draws occur). Token 1 comes from prefill; tokens 2
and 3 come from SD verify passes (first and second verify position, or a bonus token). Their exact
marginals are sums over the target's processed distributions of every prefix, computed with
transformers. Pearson's chi-square against them, with cells of expected count < 5 pooled into one,
must stay under its 1 - 1e-6 quantile (Wilson-Hilferty), so a correct step fails with
probability ~1e-6.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import EngineState
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import SamplingParams
from gleanrl.server.sampling.sampler import processed_probs
from sd_util import run_seeded, sd_on, trained_drafter

N, BATCH, TOP_K = 4000, 100, 8


def _probs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1:]
    one = torch.ones(1)
    return processed_probs(logits, one, torch.tensor([TOP_K]), one, torch.zeros(1))[0]


def _marginals(model, prompt: list[int]) -> tuple[dict[int, float], dict[int, float]]:
    """Exact P(token 2 = x) and P(token 3 = x) under the target."""
    p1 = _probs(model, prompt)
    m2: Counter = Counter()
    m3: Counter = Counter()
    for t1 in p1.nonzero()[:, 0].tolist():
        p2 = _probs(model, prompt + [t1])
        for t2 in p2.nonzero()[:, 0].tolist():
            w = float(p1[t1] * p2[t2])
            m2[t2] += w
            for t3, q in enumerate(_probs(model, prompt + [t1, t2]).tolist()):
                if q > 0:
                    m3[t3] += w * q
    return m2, m3


def _chi2(counts: Counter, expected_p: dict[int, float], n: int) -> tuple[float, float]:
    assert set(counts) <= set(expected_p), "a token outside the target's top-k support was emitted"
    big = [t for t, p in expected_p.items() if n * p >= 5]
    cells = [(counts[t], n * expected_p[t]) for t in big]
    rest = n - sum(o for o, _ in cells), n * (1 - sum(expected_p[t] for t in big))
    if rest[1] >= 5:
        cells.append(rest)
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    c = 2.0 / (9.0 * df)
    return stat, df * (1 - c + 4.753 * math.sqrt(c)) ** 3


@pytest.fixture(scope="module")
def drafter(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    return trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path_factory.mktemp("dist") / "drafter")


def test_sampled_sd_step_follows_the_target(tiny_qwen2, tiny_tokenizer, drafter):
    runner = ModelRunner.load(str(tiny_qwen2))
    spec = sd_on(runner, drafter)
    prompt = tiny_tokenizer("The quick brown fox")["input_ids"]
    params = SamplingParams(max_new_tokens=4, temperature=1.0, top_k=TOP_K, ignore_eos=True)
    outputs = run_seeded(Scheduler(EngineState(), runner, BATCH), spec, prompt, params, N)
    assert len(outputs) == N and all(len(o) == 4 for o in outputs)
    accept = spec.stats()["avg_spec_accept_length"]
    assert spec.counters.verify_ct > 0 and 1.2 < accept < 3.8  # both accepts and rejections happen
    m2, m3 = _marginals(AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval(), prompt)
    for pos, exact in ((1, m2), (2, m3)):
        stat, threshold = _chi2(Counter(o[pos] for o in outputs), exact, N)
        assert stat < threshold, f"token {pos + 1}: chi-square {stat:.1f} >= {threshold:.1f}"
