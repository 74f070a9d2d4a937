"""GRPO math on small hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from gleanrl.trainer.grpo import group_advantages, k3_kl, logprob_mismatch, policy_loss, token_logprobs


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 7, 7])
    adv = group_advantages(rewards, groups, eps=0.0 + 1e-12)
    # group 0: mean 0.5, population std 0.5 -> +-1; group 7: all equal -> 0
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, 0.0]), atol=1e-6)
    raw = group_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([1, 1, 1]), scale=False)
    assert torch.allclose(raw, torch.tensor([1.0, -1.0, 0.0]))


def test_group_advantages_unordered_groups():
    adv = group_advantages(torch.tensor([1.0, 2.0, 0.0, 4.0]), torch.tensor([5, 3, 5, 3]), scale=False)
    assert torch.allclose(adv, torch.tensor([0.5, -1.0, -0.5, 1.0]))


def test_token_logprobs_matches_manual_softmax():
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])  # [1, 2, 3]
    targets = torch.tensor([[2, 1]])
    lp = token_logprobs(logits, targets)
    z = math.log(math.e + math.e**2 + math.e**3)
    assert lp[0, 0].item() == pytest.approx(3 - z, abs=1e-6)
    assert lp[0, 1].item() == pytest.approx(-math.log(3), abs=1e-6)
    lp_t = token_logprobs(logits, targets, temperature=2.0)
    z2 = math.log(math.e**0.5 + math.e + math.e**1.5)
    assert lp_t[0, 0].item() == pytest.approx(1.5 - z2, abs=1e-6)


def test_policy_loss_on_policy_is_minus_mean_advantage_per_token():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([2.0, -1.0])
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, num_tokens=3)
    # ratio 1 everywhere: loss = -(2 + 2 - 1) / 3
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    # d loss / d logp = -A * ratio / N on valid tokens, 0 on padding
    assert torch.allclose(logp.grad, torch.tensor([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
    assert stats["clip_frac_sum"] == 0


def test_policy_loss_clips_the_ratio():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    mask = torch.ones(1, 2)
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask, num_tokens=2, clip_low=0.2, clip_high=0.2)
    # positive advantage: min(1.5, 1.2) = 1.2 (clipped, no grad); min(0.5, 0.8) = 0.5 (unclipped)
    assert loss.item() == pytest.approx(-(1.2 + 0.5) / 2)
    assert stats["clip_frac_sum"] == 1
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-0.5 / 2)
    # negative advantage: -max(-1.5, -1.2) ... i.e. per token A * max-clipped: 1.5 and 0.8
    loss_neg, _ = policy_loss(logp.detach(), old, torch.tensor([-1.0]), mask, num_tokens=2)
    assert loss_neg.item() == pytest.approx((1.5 + 0.8) / 2)


def test_k3_kl_and_kl_term():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    r = math.log(0.25) - math.log(0.5)
    assert k3_kl(logp, ref).item() == pytest.approx(math.exp(r) - r - 1)
    assert k3_kl(ref, ref).item() == 0.0
    loss, stats = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), 1, ref_logp=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * (math.exp(r) - r - 1))
    assert stats["kl_sum"] == pytest.approx(math.exp(r) - r - 1)


def test_micro_batches_sum_to_full_batch():
    torch.manual_seed(0)
    logp, old = torch.randn(4, 5), torch.randn(4, 5)
    adv, mask = torch.randn(4), (torch.rand(4, 5) > 0.3).int()
    n = int(mask.sum())
    full, _ = policy_loss(logp, old, adv, mask, n)
    parts = sum(policy_loss(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], n)[0] for i in (0, 2))
    assert full.item() == pytest.approx(parts.item(), abs=1e-6)


def test_logprob_mismatch():
    out = logprob_mismatch(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -9.0]]), torch.tensor([[1, 0]]))
    assert out["mismatch_sum"] == pytest.approx(0.5)
    assert out["mismatch_max"] == pytest.approx(0.5)


def test_token_logprobs_agree_with_the_server_convention():
    from gleanrl.server.sampling.sampler import token_logprobs as server_logprobs

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    ids = torch.randint(0, 11, (3, 5))
    for temperature in (1.0, 0.7, 1.3, 0.0):
        mine = token_logprobs(logits, ids, temperature)
        ref = server_logprobs(logits.view(-1, 11), ids.view(-1), torch.full((15,), temperature)).view(3, 5)
        assert torch.allclose(mine, ref, atol=1e-5)
