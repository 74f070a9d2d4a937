"""The policy update in bf16 autocast (`update_dtype = "bfloat16"`): float32 master weights and
logits, the logprobs of the PPO ratio close to float32's, the same gradient direction, the
harvester's capture from the same forward; refused by name when the dtype is unknown."""

from __future__ import annotations

import argparse

import pytest
import torch

from gleanrl.harvest.capture import UpdateCapture, capture
from gleanrl.trainer.cli import add_arguments
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.policy import Policy
from test_update_capture import _rollouts


def _policy(model, tmp_path, dtype: str) -> Policy:
    return Policy(TrainConfig(model=str(model), out=str(tmp_path), micro_batch_size=3, update_dtype=dtype), str(model))


def test_bf16_logprobs_are_float32_and_close(tiny_qwen2, tmp_path):
    fp32, bf16 = _policy(tiny_qwen2, tmp_path, "float32"), _policy(tiny_qwen2, tmp_path, "bfloat16")
    b = fp32._batch(_rollouts())
    exact, mixed = fp32._logprobs(fp32.model, b), bf16._logprobs(bf16.model, b)
    assert mixed.dtype == torch.float32 and bf16.model.lm_head.weight.dtype == torch.float32
    mask = b["mask"].bool()
    err = (exact - mixed)[mask].abs().max().item()
    assert 0 < err < 0.1, err  # bf16 rounding shows, and stays small


def test_bf16_update_moves_the_weights_as_float32_does(tiny_qwen2, tmp_path):
    steps = {}
    for dtype in ("float32", "bfloat16"):
        policy = _policy(tiny_qwen2, tmp_path, dtype)
        before = torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])
        stats = policy.train_step(_rollouts())
        after = torch.cat([p.detach().flatten() for p in policy.model.parameters()])
        assert all(p.dtype == torch.float32 for p in policy.model.parameters())
        assert torch.isfinite(torch.tensor(stats["loss"])) and stats["grad_norm"] > 0
        steps[dtype] = after - before
    cos = torch.nn.functional.cosine_similarity(steps["float32"], steps["bfloat16"], dim=0).item()
    assert cos > 0.9, cos


def test_bf16_update_hands_the_harvester_its_states(tiny_qwen2, tmp_path):
    policy, rollouts = _policy(tiny_qwen2, tmp_path, "bfloat16"), _rollouts()
    want = capture(
        policy.model,
        [r.prompt_ids + r.output_ids for r in rollouts],
        [0, 1, 2],
        topk=8,
        prompt_lens=[len(r.prompt_ids) for r in rollouts],
        policy_version=1,
        aux_dtype=torch.float32,
    )
    got = {}
    cap = UpdateCapture(
        [0, 1, 2], 8, torch.float32, 1, wants=lambda r: True, put=lambda r, s: got.setdefault(rollouts.index(r), s)
    )
    policy.train_step(rollouts, capture=cap)
    assert sorted(got) == [0, 1, 2, 3]
    for i, s in got.items():
        # the residual stream stays float32 under autocast; bf16 matmuls round it
        assert s.aux_hidden.shape == want[i].aux_hidden.shape
        torch.testing.assert_close(s.aux_hidden, want[i].aux_hidden, atol=0.1, rtol=0.05)


def test_unknown_update_dtype_is_refused(tiny_qwen2, tmp_path):
    with pytest.raises(ValueError, match="update_dtype"):
        TrainConfig(model=str(tiny_qwen2), out=str(tmp_path), update_dtype="float16")


def test_update_dtype_flag():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--update-dtype", "bfloat16"]).update_dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--update-dtype", "float16"])
