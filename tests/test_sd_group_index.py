"""The group index: sibling and earlier samples of the same prompt propose continuations;
bounds and ageing."""

from __future__ import annotations

import pytest

from gleanrl.server.sd.group_index import GroupIndex, GroupIndexConfig, prompt_key

PROMPT = [7, 8, 9, 10]


def _sample(index: GroupIndex, tokens: list[int], version: str = "v0", prompt: list[int] = PROMPT, done=True):
    s = index.start(prompt, version)
    index.extend(s, tokens)
    if done:
        index.finish(s)
    return s


def test_sibling_ahead_proposes_its_continuation():
    index = GroupIndex()
    _sample(index, [1, 2, 3, 4, 5, 6], done=False)  # a running sibling, ahead
    draft = index.propose(prompt_key(PROMPT), PROMPT + [1, 2], max_len=3)
    assert draft.tokens == [3, 4, 5] and draft.match_len == 4 and draft.support == [1, 1, 1]


def test_first_output_tokens_come_from_the_prompt_tail():
    index = GroupIndex()
    _sample(index, [1, 2, 3])
    assert index.propose(prompt_key(PROMPT), PROMPT, max_len=8).tokens == [1, 2, 3]


def test_majority_vote_and_agreement():
    index = GroupIndex()
    for tail in ([5, 6], [5, 6], [5, 9], [4, 4]):
        _sample(index, [1, 2, 3] + tail)
    draft = index.propose(prompt_key(PROMPT), PROMPT + [1, 2, 3], max_len=4)
    assert draft.tokens == [5, 6] and draft.candidates == 4 and draft.support == [3, 2]


def test_longest_ngram_wins_and_short_matches_fall_back():
    index = GroupIndex(GroupIndexConfig(min_n=2, max_n=3))
    _sample(index, [1, 2, 3, 50, 2, 3, 60])
    key = prompt_key(PROMPT)
    assert index.propose(key, [0, 1, 2, 3], max_len=1).tokens == [50]  # 3-gram [1, 2, 3]
    draft = index.propose(key, [0, 5, 2, 3], max_len=1)  # only the 2-gram [2, 3]
    # the most recent position
    assert draft.match_len == 2 and draft.tokens == [60]
    assert index.propose(key, [0, 5, 6, 3], max_len=4) is None  # below min_n


def test_other_prompts_and_the_own_position_propose_nothing():
    index = GroupIndex()
    s = _sample(index, [1, 2, 3], done=False)
    assert index.propose(prompt_key([7, 8, 9, 11]), PROMPT + [1, 2], max_len=4) is None
    assert index.propose(prompt_key(PROMPT), PROMPT + [1, 2, 3], max_len=4) is None  # its own end
    index.extend(s, [4])
    # grows live
    assert index.propose(prompt_key(PROMPT), PROMPT + [1, 2, 3], max_len=4).tokens == [4]


def test_token_bound_drops_oldest_finished_first_then_running():
    index = GroupIndex(GroupIndexConfig(max_tokens=10))
    old = _sample(index, [1, 2, 3, 4])
    run = _sample(index, [20, 21, 22, 23], done=False)
    # 12 tokens > 10: `old` goes
    third = _sample(index, [30, 31, 32, 33])
    key = prompt_key(PROMPT)
    assert not old.alive and run.alive and third.alive and index.tokens == 8
    assert index.propose(key, PROMPT + [1, 2], max_len=2) is None
    # 11: the finished `third` goes
    index.extend(run, [24, 25, 26])
    assert run.alive and not third.alive and index.tokens == 7
    assert index.propose(key, PROMPT + [20, 21], max_len=2).tokens == [22, 23]
    # 11, none finished: oldest running
    _sample(index, [40, 41, 42, 43], done=False)
    assert not run.alive and index.tokens == 4 and index.stats()["samples"] == 1


def test_table_is_purged_of_dropped_samples():
    cfg = GroupIndexConfig(max_tokens=200, min_n=2, max_n=4)
    index = GroupIndex(cfg)
    for i in range(100):
        _sample(index, [(i * 7 + j) % 97 for j in range(50)])
    assert index.tokens <= 200
    group = index.groups[prompt_key(PROMPT)]
    entries = sum(len(h) if isinstance(h, list) else 1 for h in group.table.values())
    assert entries <= 2 * (cfg.max_n - cfg.min_n + 1) * (index.tokens + 4 * len(group.samples))


def test_samples_age_out_by_policy_version():
    index = GroupIndex(GroupIndexConfig(keep_versions=2))
    s0 = _sample(index, [1, 2, 3], version="v0")
    s1 = _sample(index, [1, 2, 4], version="v1")
    assert s0.alive and s1.alive
    index.set_version("v2")
    assert not s0.alive and s1.alive
    assert index.propose(prompt_key(PROMPT), PROMPT + [1, 2], max_len=1).tokens == [4]
    running = _sample(index, [1, 2, 5], version="v2", done=False)
    index.set_version("v3")
    # running samples stay until done
    index.set_version("v4")
    assert not s1.alive and running.alive
    index.finish(running)
    assert index.groups == {} and index.tokens == 0


def test_siblings_in_lockstep_do_not_crowd_out_earlier_samples():
    index = GroupIndex(GroupIndexConfig(max_candidates=4))
    # an earlier, finished sample
    _sample(index, [1, 2, 3, 4])
    for _ in range(40):
        # siblings at the same position
        _sample(index, [1, 2], done=False)
    assert index.propose(prompt_key(PROMPT), PROMPT + [1, 2], max_len=2).tokens == [3, 4]


def test_identical_prompts_share_one_group_and_prompts_differ_by_exact_ids():
    assert prompt_key([1, 2, 3]) == prompt_key([1, 2, 3]) != prompt_key([1, 2, 3, 0]) != prompt_key([3, 2, 1])


@pytest.mark.parametrize(
    "kw",
    [
        dict(max_tokens=0),
        dict(keep_versions=0),
        dict(min_n=0),
        dict(min_n=3, max_n=2),
        dict(max_hits=0),
        dict(max_candidates=0),
        dict(max_draft=33),
        dict(min_prob=1.0),
    ],
)
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        GroupIndexConfig(**kw)


def test_draft_length_adapts_to_the_estimate():
    """Agreeing siblings: a long draft (0.9 a token for 8 of 8: 21 tokens over 0.1; all of max_draft
    with no threshold); one lone sample: short (2/3 a token); a split vote lowers the estimate where
    the samples part."""
    index = GroupIndex(GroupIndexConfig(min_prob=0.1, max_draft=32))
    key = prompt_key(PROMPT)
    for _ in range(8):
        _sample(index, list(range(100, 150)))
    agreed = index.propose(key, PROMPT)
    assert agreed.tokens == list(range(100, 121)) and agreed.probs == pytest.approx([9 / 10] * 21)
    unbounded = GroupIndex(GroupIndexConfig(min_prob=0.0))
    _sample(unbounded, list(range(100, 150)))
    assert unbounded.propose(key, PROMPT).tokens == list(range(100, 132))
    lone = GroupIndex(GroupIndexConfig(min_prob=0.1))
    _sample(lone, list(range(100, 150)))
    assert len(lone.propose(key, PROMPT).tokens) == 5  # (2/3)^5 >= 0.1 > (2/3)^6
    split = GroupIndex(GroupIndexConfig(min_prob=0.2))
    for tail in ([5, 6, 7], [5, 6, 7], [5, 8, 9], [5, 8, 9]):
        _sample(split, [1, 2, 3] + tail)
    draft = split.propose(key, PROMPT + [1, 2, 3])
    # tie: most recent
    assert draft.tokens == [5, 8, 9] and draft.probs == pytest.approx([5 / 6, 3 / 6, 3 / 4])
    assert index.propose(key, PROMPT, max_len=4).tokens == [100, 101, 102, 103]
