"""GRPO moves the policy the right way: on a dense toy reward the mean reward rises within a few
steps (a sign error in the loss or the advantages makes it fall)."""

from __future__ import annotations

import json

from gleanrl.trainer.loop import train
from serving import running_server
from test_train import ToyTask, _cfg


def test_reward_rises_on_a_dense_toy_reward(tiny_qwen2, tmp_path):
    with running_server(tiny_qwen2) as url:
        cfg = _cfg(
            tiny_qwen2,
            tmp_path / "run",
            servers=[url],
            steps=10,
            lr=3e-3,
            prompts_per_step=4,
            samples_per_prompt=4,
            max_new_tokens=16,
        )
        train(cfg, task=ToyTask(), log=lambda *a: None)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rewards = [json.loads(line)["reward_mean"] for line in lines]
    assert len(rewards) == 10
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first * 1.3, rewards
