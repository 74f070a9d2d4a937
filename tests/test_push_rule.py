"""The paired, prompt-clustered test that gates drafter pushes (harvest.pushing)."""

from __future__ import annotations

import math

import pytest
import torch

from gleanrl.harvest.pushing import paired_verdict, t_quantile


def test_gain_is_the_pooled_difference_and_se_is_clustered_by_prompt():
    serving = [(10.0, 5), (12.0, 6), (8.0, 4), (20.0, 10)]
    candidate = [(12.0, 5), (12.0, 6), (10.0, 4), (20.0, 10)]
    v = paired_verdict(candidate, serving, prompts=[1, 1, 2, 2])
    assert v.gain == pytest.approx(4 / 25) and v.prompts == 2 and v.samples == 4
    assert v.serving == pytest.approx(50 / 25) and v.candidate == pytest.approx(54 / 25)
    d, n = [2.0, 2.0], [11, 14]  # per prompt
    se = math.sqrt(2 * sum((di - v.gain * ni) ** 2 for di, ni in zip(d, n))) / 25
    assert v.se == pytest.approx(se) and v.lower == pytest.approx(v.gain - t_quantile(2.0, 1) * se)
    # the same figures as independent samples would give a smaller se: clustering matters
    apart = paired_verdict(candidate, serving, prompts=[1, 2, 3, 4])
    assert apart.gain == pytest.approx(v.gain) and apart.prompts == 4


def test_one_prompt_gives_no_bound_and_nothing_gives_no_verdict():
    v = paired_verdict([(3.0, 2)], [(2.0, 2)], prompts=[7])
    assert v.gain == pytest.approx(0.5) and v.lower == -math.inf
    assert paired_verdict([], [], prompts=[]) is None


def test_t_quantile_is_close_to_students():
    # one-sided 0.97725 quantiles of Student's t (z = 2), from tables
    for df, exact in [(3, 3.307), (5, 2.649), (10, 2.284), (30, 2.087)]:
        assert t_quantile(2.0, df) == pytest.approx(exact, rel=0.05)
    assert t_quantile(2.0, 0) == math.inf


def test_noise_alone_rarely_passes():
    """Under no true gain, the lower bound clears 0 in about 2.3 % of draws (z = 2)."""
    gen = torch.Generator().manual_seed(0)
    passes = 0
    for _ in range(400):
        base = torch.rand(40, generator=gen) * 10 + 5
        noise = torch.randn(40, generator=gen)
        serving = [(float(b), 5) for b in base]
        candidate = [(float(b + e), 5) for b, e in zip(base, noise)]
        passes += paired_verdict(candidate, serving, prompts=[i // 4 for i in range(40)]).lower > 0
    assert passes <= 20  # expected ~9 of 400


def test_gate_decides_and_says_why_in_words():
    from gleanrl.harvest.pushing import Gate, Verdict

    gate = Gate(min_prompts=4, min_samples=8, min_gain=0.02, mid_step_gain=0.3)

    def verdict(prompts=6, samples=12, gain=0.5, se=0.05, lower=0.4):
        return Verdict(gain, se, lower, prompts, samples, 2.0 + gain, 2.0)

    assert gate.decide(None, True)[0] == "hold"
    action, why = gate.decide(verdict(prompts=2), True)
    assert action == "hold" and why == "held-out prompts 2 of the 4 needed"
    action, why = gate.decide(verdict(samples=5), True)
    assert action == "hold" and why == "held-out samples 5 of the 8 needed"
    action, why = gate.decide(verdict(gain=0.05, lower=-0.01), True)
    assert action == "hold" and "lower bound -0.010: not above 0.02" in why
    assert gate.decide(verdict(lower=0.1), boundary=False)[0] == "pending"  # a small win waits
    assert gate.decide(verdict(lower=0.1), boundary=True)[0] == "push"
    action, why = gate.decide(verdict(lower=0.4), boundary=False)  # a large one swaps now
    assert action == "push" and why.startswith("gain +0.500 ± 0.050") and "on 6 prompts" in why
