"""The source bandit: which arms are available, the prior, convergence to the best source per bucket,
EAGLE-3 measurements shared with SDPolicy's keys, and knowledge kept across a drafter swap."""
from __future__ import annotations

import random

import pytest

from gleanrl.server.sd.policy import SDPolicyConfig
from gleanrl.server.sd.source_policy import GroupSDConfig, SourcePolicy


def test_arms_follow_the_drafter_and_the_per_source_batch_limits():
    p = SourcePolicy(SDPolicyConfig(max_batch=8, choices=(0, 2, 4)), GroupSDConfig(group_choices=(4, 8),
                                                                                   group_max_batch=32))
    assert p.arms(4, has_drafter=True) == [("plain", 0), ("eagle", 2), ("eagle", 4), ("group", 4), ("group", 8),
                                           ("fused", 2), ("fused", 4)]
    assert p.arms(16, has_drafter=True) == [("plain", 0), ("group", 4), ("group", 8)]   # EAGLE-3 off above 8
    assert p.arms(4, has_drafter=False) == [("plain", 0), ("group", 4), ("group", 8)]
    assert p.arms(64, has_drafter=True) == [("plain", 0)] and p.choose(64, True) == ("plain", 0)
    assert SourcePolicy(SDPolicyConfig(mode="off")).choose(1, True) == ("plain", 0)


def test_prior_is_the_fused_tree_at_the_table_length():
    p = SourcePolicy(SDPolicyConfig(epsilon=0.0))
    assert p.choose(1, True) == ("fused", 4) and p.choose(8, True) == ("fused", 2)
    assert p.choose(1, False)[0] == "group"
    assert SourcePolicy(SDPolicyConfig(epsilon=0.0), GroupSDConfig(sources=("eagle",))).choose(1, True) == ("eagle", 4)


RATES = {"plain": 1.0, "eagle": 1.6, "group": 2.5, "fused": 3.0}   # tokens per second, per arm's source


@pytest.mark.parametrize("best", ["group", "eagle", "plain"])
def test_bandit_converges_to_the_best_source(best):
    rates = dict(RATES, **{best: 5.0})
    p, rng = SourcePolicy(SDPolicyConfig(epsilon=0.1, seed=1)), random.Random(0)
    chosen = []
    for _ in range(3000):
        arm = p.choose(4, True)
        p.record_arm(4, arm, int(100 * rates[arm[0]] * rng.uniform(0.9, 1.1)), 1.0)
        chosen.append(arm[0])
    assert chosen[-500:].count(best) > 400


def test_every_arm_is_tried_once_then_the_best_is_played():
    p = SourcePolicy(SDPolicyConfig(epsilon=0.0, choices=(0, 4)), GroupSDConfig(group_choices=(4,)))
    tried = []
    for _ in range(4):
        arm = p.choose(2, True)
        tried.append(arm)
        p.record_arm(2, arm, 200 if arm == ("group", 4) else 100, 1.0)
    assert tried[0] == ("fused", 4) and sorted(tried) == sorted(p.arms(2, True))
    assert p.choose(2, True) == ("group", 4)
    assert p.measured() == {2: {"fused:4": 100.0, "plain:0": 100.0, "eagle:4": 100.0, "group:4": 200.0}}


def test_eagle_arms_share_sdpolicy_keys_and_survive_a_swap():
    p = SourcePolicy(SDPolicyConfig(mode="on", epsilon=0.0, choices=(3,)),
                     GroupSDConfig(sources=("eagle", "group"), group_choices=(8,)))
    p.record_arm(1, ("eagle", 3), 50, 1.0)
    p.record_arm(1, ("group", 8), 80, 1.0)
    assert p.mean_reward(1, 3) == 50.0 and p.mean_reward(1, ("group", 8)) == 80.0
    p.decay()
    assert p.choose(1, True) == ("group", 8)                       # kept, not reset


@pytest.mark.parametrize("kw", [dict(sources=()), dict(sources=("tree",)), dict(group_choices=(0,)),
                                dict(group_len=17), dict(group_max_batch=0)])
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        GroupSDConfig(**kw)
