"""The policy update's micro-batches hold rollouts of like lengths (right padding to a micro-batch's
longest row is wasted compute when siblings differ 10-30x in length), and the step is the one a single
batch of all rollouts makes."""

from __future__ import annotations

import torch

from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.policy import Policy
from test_update_capture import _rollouts


def _policy(model, tmp_path, micro: int) -> Policy:
    torch.manual_seed(0)
    return Policy(TrainConfig(model=str(model), out=str(tmp_path), micro_batch_size=micro), str(model))


def test_micro_batches_group_like_lengths(tiny_qwen2, tmp_path):
    policy, rollouts = _policy(tiny_qwen2, tmp_path, 2), _rollouts()  # lengths 13, 9, 15, 12 in group order
    rollouts[1].reset()  # nothing to learn from: left out of every micro-batch
    seen, batch = [], policy._batch
    policy._batch = lambda rows: seen.append([len(r.prompt_ids) + len(r.output_ids) for r in rows]) or batch(rows)
    policy.train_step(rollouts)
    assert seen == [[12, 13], [15]]


def test_grouped_micro_batches_make_the_single_batch_step(tiny_qwen2, tmp_path):
    steps = []
    for micro in (2, 4):
        policy = _policy(tiny_qwen2, tmp_path / str(micro), micro)
        before = torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])
        policy.train_step(_rollouts())
        steps.append(torch.cat([p.detach().flatten() for p in policy.model.parameters()]) - before)
    assert steps[0].abs().max() > 0
    torch.testing.assert_close(steps[0], steps[1], atol=1e-6, rtol=1e-4)
