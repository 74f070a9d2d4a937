"""Adaptive SD policy: the batch-size switch, the fixed-table fallback and the bucketed bandit."""
from __future__ import annotations

import random

import pytest

from gleanrl.server.sd.policy import DEFAULT_TABLE, SDPolicy, SDPolicyConfig


def _simulated_iteration(k: int, batch: int, alpha: float, verify_cost: float, rng: random.Random):
    """Tokens and seconds of one SD iteration: acceptance rate alpha per draft token (expected emitted
    tokens per sequence (1 - alpha^(k+1)) / (1 - alpha)); each draft step costs 0.1 of a plain step,
    verifying k+1 positions costs verify_cost per extra position per sequence (compute-bound batches)."""
    tokens = batch * (1 - alpha ** (k + 1)) / (1 - alpha)
    seconds = 1.0 + 0.1 * k + verify_cost * k * batch
    return tokens, seconds * rng.uniform(0.9, 1.1)


def _best_k(batch: int, alpha: float, verify_cost: float, choices) -> int:
    def rate(k):
        return batch * (1 - alpha ** (k + 1)) / (1 - alpha) / (1.0 + 0.1 * k + verify_cost * k * batch)
    return max(choices, key=rate)


def _run(policy: SDPolicy, batch: int, alpha: float, verify_cost: float, steps: int, seed: int = 0) -> list[int]:
    rng, chosen = random.Random(seed), []
    for _ in range(steps):
        k = policy.choose_k(batch)
        policy.record(batch, k, *_simulated_iteration(k, batch, alpha, verify_cost, rng))
        chosen.append(k)
    return chosen


def test_switch_by_mode_and_running_requests():
    adaptive = SDPolicy(SDPolicyConfig(mode="adaptive", max_batch=8))
    assert [adaptive.use_sd(n) for n in (0, 1, 8, 9, 32)] == [False, True, True, False, False]
    assert SDPolicy(SDPolicyConfig(mode="on")).use_sd(64)
    assert not SDPolicy(SDPolicyConfig(mode="off")).use_sd(1)


def test_buckets_and_table_fallback():
    policy = SDPolicy(SDPolicyConfig(epsilon=0.0))
    assert [policy.bucket(b) for b in (1, 2, 3, 5, 8, 9, 100)] == [1, 2, 4, 8, 8, 16, 32]
    assert [policy.choose_k(b) for b in (1, 3, 8, 100)] == [DEFAULT_TABLE[b] for b in (1, 4, 8, 32)]
    assert SDPolicy(SDPolicyConfig(fixed_k=5, epsilon=1.0)).choose_k(1) == 5


@pytest.mark.parametrize("batch,alpha,verify_cost", [(1, 0.85, 0.0), (8, 0.3, 0.15)])
def test_bandit_converges_to_the_best_draft_length_per_bucket(batch, alpha, verify_cost):
    policy = SDPolicy(SDPolicyConfig(epsilon=0.1, seed=1))
    best = _best_k(batch, alpha, verify_cost, policy.config.choices)
    chosen = _run(policy, batch, alpha, verify_cost, steps=600)
    assert best != policy.config.table[policy.bucket(batch)], "the scenario must differ from the table"
    assert chosen[-200:].count(best) >= 0.8 * 200, f"best {best}, chose {chosen[-200:]}"


def test_buckets_learn_independently():
    policy = SDPolicy(SDPolicyConfig(epsilon=0.1, seed=2))
    rng = random.Random(0)
    for _ in range(800):  # batch 1 is memory-bound with a good drafter, batch 8 compute-bound
        for batch, alpha, cost in ((1, 0.85, 0.0), (8, 0.3, 0.15)):
            k = policy.choose_k(batch)
            policy.record(batch, k, *_simulated_iteration(k, batch, alpha, cost, rng))
    greedy = SDPolicy(SDPolicyConfig(epsilon=0.0))
    greedy._rewards = policy._rewards
    assert greedy.choose_k(1) == _best_k(1, 0.85, 0.0, policy.config.choices)
    assert greedy.choose_k(8) == _best_k(8, 0.3, 0.15, policy.config.choices)


def test_sliding_window_follows_a_better_drafter():
    policy = SDPolicy(SDPolicyConfig(epsilon=0.15, seed=3, window=8))
    _run(policy, 1, alpha=0.2, verify_cost=0.3, steps=400)            # stale drafter: short drafts win
    short = _best_k(1, 0.2, 0.3, policy.config.choices)
    long_ = _best_k(1, 0.95, 0.0, policy.config.choices)
    assert short < long_
    chosen = _run(policy, 1, alpha=0.95, verify_cost=0.0, steps=600, seed=1)
    assert chosen[-200:].count(long_) >= 0.7 * 200


def test_plain_decoding_competes_only_in_adaptive_mode():
    """Arm 0 (no drafting) wins where SD does not pay; mode "on" always drafts."""
    adaptive, on = SDPolicy(SDPolicyConfig(epsilon=0.1, seed=4)), SDPolicy(SDPolicyConfig(mode="on", seed=4))
    assert _best_k(8, 0.3, 0.15, adaptive.config.choices) == 0
    assert _run(adaptive, 8, alpha=0.3, verify_cost=0.15, steps=400)[-100:].count(0) >= 80
    assert 0 not in _run(on, 8, alpha=0.3, verify_cost=0.15, steps=400)


def test_drafter_swap_decays_knowledge_toward_the_table():
    """A hot swap keeps the ranking (not a reset), new measurements weigh more than old ones, and
    knowledge never renewed fades back to the table (issue 17)."""
    policy = SDPolicy(SDPolicyConfig(epsilon=0.0, swap_decay=0.5, min_weight=0.05))
    for _ in range(4):
        policy.record(1, 6, tokens=100, seconds=1.0)
        policy.record(1, 2, tokens=50, seconds=1.0)
    policy.decay()
    assert policy.choose_k(1) == 6                                     # the old ranking stands
    policy.record(1, 6, tokens=20, seconds=1.0)                        # the new drafter does worse at k=6
    assert policy.mean_reward(1, 6) == pytest.approx((4 * 0.5 * 100 + 20) / (4 * 0.5 + 1))  # not (400 + 20) / 5
    for _ in range(4):
        policy.decay()
    assert policy.mean_reward(1, 2) is None and policy.mean_reward(1, 6) == pytest.approx(20.0)
    for _ in range(5):
        policy.decay()
    assert policy.choose_k(1) == DEFAULT_TABLE[1]                      # back to the prior


@pytest.mark.parametrize("kw", [dict(mode="sometimes"), dict(max_batch=0), dict(fixed_k=0), dict(choices=()),
                                dict(epsilon=1.5), dict(window=0), dict(table={1: 0}),
                                dict(swap_decay=0.0), dict(min_weight=1.0)])
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        SDPolicyConfig(**kw)
