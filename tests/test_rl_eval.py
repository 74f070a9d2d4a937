"""Held-out evaluation of the RL loop: at step 0, every `eval_every` steps and the last step, on the
same prompts and seeds each time; accuracy with its standard error over prompts, the paired gain
against step 0, a greedy pass; the demo report's accuracy curve reads those rows."""

from __future__ import annotations

import json
import math
import random

import pytest

from gleanrl.clients.rollout import Rollout
from gleanrl.demo_report import eval_summary, write_report
from gleanrl.trainer.loop import informative, train
from gleanrl.trainer.metrics import eval_metrics, mean_se
from gleanrl.trainer.tasks.base import Task
from serving import running_server
from test_train import _cfg


class DigitTask(Task):
    """Correct when the response holds a digit: a random tiny model gets some right, some wrong."""

    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        rng = random.Random(f"{split}/{seed}")
        return [{"prompt": f"what is {rng.randint(0, 9)} + {rng.randint(0, 9)}?"} for _ in range(n)]

    def reward(self, sample: dict, response: str) -> float:
        return float(any(c.isdigit() for c in response))


def _rollout(group: int, n_tokens: int = 3) -> Rollout:
    return Rollout(group_id=group, index=0, sample={}, prompt_ids=[1], rid=f"r{group}", output_ids=[5] * n_tokens)


def test_eval_metrics_se_over_prompts_and_paired_gain():
    # 3 prompts x 2 samples: per-prompt means 1, 0.5, 0
    rollouts = [_rollout(g) for g in (0, 0, 1, 1, 2, 2)]
    correct = iter([1, 1, 1, 0, 0, 0])
    row = eval_metrics(rollouts, lambda r: next(correct), baseline=[0.5, 0.5, 0.0])
    assert row["eval_scores"] == [1.0, 0.5, 0.0] and row["eval_accuracy"] == pytest.approx(0.5)
    # sample variance 0.25 over 3 prompts
    assert row["eval_se"] == pytest.approx(math.sqrt(0.25 / 3))
    assert row["eval_gain"] == pytest.approx(0.5 / 3)  # diffs 0.5, 0, 0
    assert row["eval_gain_se"] == pytest.approx(math.sqrt((2 * (1 / 6) ** 2 + (1 / 3) ** 2) / 2 / 3))
    assert row["eval_prompts"] == 3 and row["eval_rollouts"] == 6
    assert "eval_gain" not in eval_metrics(rollouts[:2], lambda r: 1.0, baseline=[0.5, 0.5, 0.0])
    assert mean_se([0.7]) == (0.7, 0.0)


def test_only_groups_with_differing_rewards_are_trained_on():
    rollouts = [_rollout(g) for g in (0, 0, 1, 1, 2, 2)]
    for r, reward in zip(rollouts, (1.0, 1.0, 0.0, 1.0, 0.0, 0.0)):
        r.reward = reward
    assert [r.group_id for r in informative(rollouts)] == [1, 1]
    assert informative(rollouts[:2]) == []


def test_eval_runs_at_step_0_every_n_and_the_last_step(tiny_qwen2, tmp_path):
    out = tmp_path / "run"
    with running_server(tiny_qwen2) as url:
        cfg = _cfg(
            tiny_qwen2,
            out,
            servers=[url],
            steps=3,
            eval_every=2,
            eval_prompts=5,
            eval_samples=2,
            eval_temperature=1.0,
            eval_greedy=True,
            max_new_tokens=6,
        )
        train(cfg, task=DigitTask(), log=lambda *a: None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    evals = [r for r in rows if "eval_accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2, 3]  # 3: the last step, though not a multiple of 2
    for r in evals:
        assert len(r["eval_scores"]) == 5 and r["eval_rollouts"] == 10 and r["eval_temperature"] == 1.0
        assert r["eval_accuracy"] == pytest.approx(sum(r["eval_scores"]) / 5) and r["eval_se"] >= 0
        assert len(r["eval_greedy_scores"]) == 5 and set(r["eval_greedy_scores"]) <= {0.0, 1.0}
    assert "eval_gain" not in evals[0] and "eval_greedy_gain" not in evals[0]
    for r in evals[1:]:  # paired with step 0's scores, prompt by prompt
        base = evals[0]["eval_scores"]
        assert r["eval_gain"] == pytest.approx(sum(a - b for a, b in zip(r["eval_scores"], base)) / 5)
        assert "eval_gain_se" in r and "eval_greedy_gain" in r

    report = write_report(
        tmp_path, rows, [[3, 4]], [{"question": "q", "expected": "b", "answer": "a", "correct": False}], {}
    )
    text = report.read_text()
    assert (tmp_path / "accuracy.png").stat().st_size > 1000 and "](accuracy.png)" in text
    assert eval_summary(rows) in text and f"{evals[-1]['eval_accuracy']:.3f} ± {evals[-1]['eval_se']:.3f}" in text
    assert text.count("\n| 0 |") == 1 and text.count("\n| 3 |") == 1


def test_negative_weight_scales_only_negative_advantages():
    import torch

    from gleanrl.trainer.grpo import group_advantages

    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 1, 1, 1])
    full = group_advantages(rewards, groups)
    leaning = group_advantages(rewards, groups, negative_weight=0.1)
    assert torch.allclose(leaning, torch.where(full < 0, 0.1 * full, full)) and (full < 0).any() and (full > 0).any()
