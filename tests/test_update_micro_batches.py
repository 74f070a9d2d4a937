"""The policy update's micro-batches hold rollouts of like lengths (right padding to a micro-batch's
longest row is wasted compute when siblings differ 10-30x in length), and the step is the one a single
batch of all rollouts makes."""

from __future__ import annotations

import torch

from gleanrl.base.batches import length_batches
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.policy import Policy
from test_update_capture import _rollouts


def _policy(model, tmp_path, micro: int, tokens: int = 4096) -> Policy:
    torch.manual_seed(0)
    cfg = TrainConfig(model=str(model), out=str(tmp_path), micro_batch_size=micro, micro_batch_tokens=tokens)
    return Policy(cfg, str(model))


def test_micro_batches_sorted_and_bounded_by_rows_and_tokens():
    lengths = [300, 0, 20, 1400, 25, 30, 280, 22, 0, 900]
    assert length_batches(lengths, 3, 0) == [[2, 7, 4], [5, 6, 0], [9, 3]]  # empty rows left out
    # at most 3 rows and 1000 padded tokens: 3 x 300 fits, 2 x 900 does not, 1400 goes alone
    assert length_batches(lengths, 3, 1000) == [[2, 7, 4], [5, 6, 0], [9], [3]]
    assert length_batches([0, 0], 8, 4096) == []


def test_micro_batches_group_like_lengths(tiny_qwen2, tmp_path):
    policy, rollouts = _policy(tiny_qwen2, tmp_path, 2), _rollouts()  # lengths 13, 9, 15, 12 in group order
    rollouts[1].reset()  # nothing to learn from: left out of every micro-batch
    seen, batch = [], policy._batch
    policy._batch = lambda rows: seen.append([len(r.prompt_ids) + len(r.output_ids) for r in rows]) or batch(rows)
    policy.train_step(rollouts)
    assert seen == [[12, 13], [15]]


def test_grouped_micro_batches_make_the_single_batch_step(tiny_qwen2, tmp_path):
    steps = []
    for micro, tokens in ((2, 0), (4, 26), (4, 0)):  # 26 tokens: 9 + 12 together, 13 and 15 alone
        policy = _policy(tiny_qwen2, tmp_path / f"{micro}-{tokens}", micro, tokens)
        before = torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])
        policy.train_step(_rollouts())
        steps.append(torch.cat([p.detach().flatten() for p in policy.model.parameters()]) - before)
    assert steps[0].abs().max() > 0
    torch.testing.assert_close(steps[0], steps[2], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(steps[1], steps[2], atol=1e-6, rtol=1e-4)
