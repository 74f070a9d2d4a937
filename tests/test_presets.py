"""Regimes of the built-in task: the long-tail preset draws its share of each batch from the tail in
the default task's format (so the default bootstrap answers it) and fits its token cap; the default
task's problems are unchanged by the new knobs; unknown names are refused."""

from __future__ import annotations

import random

import pytest

from gleanrl.trainer.tasks import Doubling, load_task
from gleanrl.trainer.tasks.presets import REGIMES, regime


def test_default_task_draws_what_it_drew():
    rng = random.Random("doubling/train/3")
    assert Doubling().prompts("train", 16, 3) == [Doubling().sample(rng) for _ in range(16)]


def test_long_tail_preset():
    r = regime("long_tail")
    task = load_task(r.task)
    batches = [task.prompts("train", r.prompts_per_step, seed) for seed in range(200)]
    tails = [sum(s["steps"] >= 80 for s in b) for b in batches]
    assert 0.8 <= sum(tails) / len(tails) <= 1.2 and tails.count(1) > len(tails) / 2
    longest = max((s for b in batches for s in b), key=lambda s: s["steps"])
    # one token per character, plus end of turn
    assert len(task.solution(longest)) + 1 <= r.max_new_tokens
    assert task.reward(longest, task.solution(longest)) == 1.0
    short = load_task(regime("short").task)
    assert [sum(s["steps"] >= 80 for s in short.prompts("train", 8, seed)) for seed in range(200)].count(0) > 150
    assert set(REGIMES) >= {"long_tail", "short"}


def test_bad_presets_refused():
    with pytest.raises(ValueError, match="unknown regime"):
        regime("longest")
    with pytest.raises(ValueError, match="tail_share"):
        Doubling(tail_share=1.5)
    with pytest.raises(ValueError, match="tail_min"):
        Doubling(tail_share=0.5, tail_min=120)
