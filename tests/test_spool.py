"""Spool: bounds in tokens and bytes, oldest evicted first, atomic shards, resume,
recency-weighted sampling."""

from __future__ import annotations

import pytest
import torch

from gleanrl.harvest.spool import Spool, SpoolConfig


def _sample(tokens: int, width: int = 6, fill: float = 0.0, prompt: int = 0) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.arange(tokens) + 1000 * prompt, "aux_hidden": torch.full((tokens, width), float(fill))}


def test_memory_bounds_evict_oldest_first():
    spool = Spool(None, SpoolConfig(max_mem_tokens=25, holdout_every=0))
    for i in range(6):
        spool.add(_sample(10, fill=i), policy_version=i)
    assert spool.mem_tokens <= 25
    kept = [it.policy_version for it in spool.sample(200, torch.Generator().manual_seed(0))]
    assert set(kept) == {4, 5}  # only the two newest fit


def test_byte_bound_on_memory_and_disk(tmp_path):
    one = _sample(10)
    per_sample = sum(t.numel() * t.element_size() for t in one.values())
    cfg = SpoolConfig(max_mem_bytes=3 * per_sample, max_disk_bytes=5 * per_sample + 5 * 200, holdout_every=0)
    spool = Spool(tmp_path, cfg)
    for i in range(10):
        spool.add(_sample(10, fill=i), policy_version=0)
    assert len(spool) == 3 and spool.mem_bytes <= cfg.max_mem_bytes
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert spool.disk_bytes <= cfg.max_disk_bytes and 3 <= len(shards) < 10
    assert shards[-1] == f"{9:010d}.safetensors"  # the newest survived, the oldest went
    assert f"{0:010d}.safetensors" not in shards


def test_disk_token_bound_and_no_temp_files(tmp_path):
    spool = Spool(tmp_path, SpoolConfig(max_mem_tokens=100, max_disk_tokens=30, holdout_every=0))
    for i in range(7):
        spool.add(_sample(10), policy_version=i)
    files = list(tmp_path.iterdir())
    assert len(files) == 3 and all(p.suffix == ".safetensors" for p in files)
    assert spool.disk_tokens == 30


def test_resume_keeps_spool(tmp_path):
    spool = Spool(tmp_path, SpoolConfig(holdout_every=3))
    for i in range(7):
        spool.add(_sample(5, fill=float(i), prompt=i), policy_version=i // 2)
    before = {it.seq: it for it in spool._mem.values()}
    resumed = Spool(tmp_path, SpoolConfig(holdout_every=3))
    assert len(resumed) == len(spool) == 7 and resumed.newest_version == 3
    for seq, item in resumed._mem.items():
        assert item.policy_version == before[seq].policy_version and item.holdout == before[seq].holdout
        for name, t in item.tensors.items():
            assert torch.equal(t, before[seq].tensors[name])
    assert resumed.add(_sample(4), policy_version=4).seq == 7  # numbering continues
    assert [it.seq for it in resumed.holdout(policy_version=0)] == [it.seq for it in spool.holdout(policy_version=0)]
    assert [it.prompt for it in resumed._mem.values()][:7] == [it.prompt for it in before.values()]


def test_resume_respects_memory_limit(tmp_path):
    spool = Spool(tmp_path, SpoolConfig(max_mem_tokens=1000, holdout_every=0))
    for i in range(5):
        spool.add(_sample(10), policy_version=i)
    resumed = Spool(tmp_path, SpoolConfig(max_mem_tokens=20, holdout_every=0))
    assert [it.seq for it in resumed._mem.values()] == [3, 4]


def test_holdout_split_is_never_sampled():
    spool = Spool(None, SpoolConfig(holdout_every=4), min_holdout_prompts=0)  # the hash rule alone
    for i in range(48):  # 24 prompts, 2 samples each, policy versions 0 and 1
        spool.add(_sample(3, prompt=i // 2), policy_version=i // 24)
    items = list(spool._mem.values())
    held_prompts = {it.prompt for it in items if it.holdout}
    assert held_prompts and held_prompts == {it.prompt for it in items if it.prompt % 4 == 0}
    assert all(it.holdout == (it.prompt in held_prompts) for it in items)  # whole groups
    held = spool.holdout()
    assert held and all(it.policy_version == 1 and it.holdout for it in held)
    drawn = spool.sample(300, torch.Generator().manual_seed(1))
    assert not any(it.holdout for it in drawn)


def test_sampling_favours_recent_versions():
    spool = Spool(None, SpoolConfig(version_decay=0.25, holdout_every=0))
    for v in (0, 1, 2):
        for _ in range(4):
            spool.add(_sample(3), policy_version=v)
    counts = torch.bincount(
        torch.tensor([it.policy_version for it in spool.sample(4000, torch.Generator().manual_seed(0))]), minlength=3
    )
    # expected shares 1/21, 4/21, 16/21
    assert counts[2] > 3 * counts[1] > 9 * counts[0] > 0


def test_rejects_bad_samples_and_config():
    spool = Spool(None)
    with pytest.raises(ValueError, match="input_ids"):
        spool.add({"aux_hidden": torch.zeros(3, 2)}, 0)
    with pytest.raises(ValueError, match="first dim"):
        spool.add({"input_ids": torch.zeros(3), "aux_hidden": torch.zeros(4, 2)}, 0)
    with pytest.raises(ValueError, match="version_decay"):
        SpoolConfig(version_decay=0.0)
    assert spool.sample(4) == [] and spool.holdout() == []


def test_running_totals_match_contents(tmp_path):
    spool = Spool(tmp_path, SpoolConfig(max_mem_tokens=40, max_disk_tokens=70, holdout_every=0))
    for i in range(9):
        spool.add(_sample(3 + i), policy_version=i)
    items = list(spool._mem.values())
    assert spool.mem_tokens == sum(it.tokens for it in items) <= 40
    assert spool.mem_bytes == sum(it.nbytes for it in items)
    assert spool.disk_tokens == sum(t for _, t, _ in spool._disk.values()) <= 70
    assert spool.disk_bytes == sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    resumed = Spool(tmp_path, SpoolConfig(max_mem_tokens=40, max_disk_tokens=70, holdout_every=0))
    assert (resumed.mem_tokens, resumed.disk_tokens, resumed.disk_bytes) == (
        spool.mem_tokens,
        spool.disk_tokens,
        spool.disk_bytes,
    )


def test_holdout_spans_the_newest_versions():
    spool = Spool(None, SpoolConfig(holdout_every=2))
    for i in range(12):  # one held-out prompt (4) per version: seq 0, 4 (v0), 8 (v1), 12 (v2)
        spool.add(_sample(3, prompt=4 if i % 4 == 0 else 1), policy_version=i // 4)
    spool.add(_sample(3, prompt=4), policy_version=2)
    assert [it.seq for it in spool.holdout()] == [8, 12]
    assert [it.seq for it in spool.holdout(versions=2)] == [4, 8, 12]
    assert [it.seq for it in spool.holdout(policy_version=0, versions=3)] == [0]


def test_first_new_prompts_are_held_out_until_enough_and_keep_their_side(tmp_path):
    """Every other new prompt is held out until 3 are (a push can be scored in the first steps);
    a prompt keeps its side in later steps and across a resume; later new prompts are trained on."""
    cfg = SpoolConfig(holdout_every=1 << 62)  # the hash rule holds nothing out here
    spool = Spool(tmp_path, cfg, min_holdout_prompts=3)
    for p in range(7):
        spool.add(_sample(3, prompt=p), policy_version=0)
    side = {it.prompt: it.holdout for it in spool._mem.values()}
    assert list(side.values()) == [True, False, True, False, True, False, False]
    assert spool.prompt_counts() == (7, 3)
    for p in (0, 1, 8):
        spool.add(_sample(3, prompt=p), policy_version=1)
    resumed = Spool(tmp_path, cfg, min_holdout_prompts=3)
    resumed.add(_sample(3, prompt=2), policy_version=2)
    resumed.add(_sample(3, prompt=9), policy_version=2)
    later = list(resumed._mem.values())[-5:]
    assert [it.holdout for it in later] == [True, False, False, True, False]
    assert resumed.prompt_counts() == (9, 3)


def test_a_loop_reusing_few_prompts_holds_out_at_most_half():
    spool = Spool(None, SpoolConfig(holdout_every=1 << 62), min_holdout_prompts=4)
    for step in range(3):
        for p in range(4):
            spool.add(_sample(3, prompt=p), policy_version=step)
    assert spool.prompt_counts() == (4, 2)
    assert spool.sample(50, torch.Generator().manual_seed(0))  # half is still trained on


def test_held_out_samples_scored_cover_as_many_prompts_as_they_can():
    """8 samples a prompt (a GRPO group) and 16 scored: the newest 16 alone would be 2 prompts,
    fewer than a push needs; spread over the prompts they are 4 prompts x 4 samples."""
    from gleanrl.harvest.config import HarvestConfig
    from gleanrl.harvest.pushing import pick_holdout

    spool = Spool(None, SpoolConfig(holdout_every=1 << 62), min_holdout_prompts=4)
    for p in range(8):  # prompts 0, 2, 4, 6 are held out (every other new one until 4 are)
        for _ in range(8):
            spool.add(_sample(3, prompt=p), policy_version=0)
    held = pick_holdout(spool, HarvestConfig(max_holdout=16))
    assert len(held) == 16 and [it.seq for it in held] == sorted(it.seq for it in held)
    by_prompt = {}
    for it in held:
        by_prompt[it.prompt] = by_prompt.get(it.prompt, 0) + 1
    assert len(by_prompt) == 4 and set(by_prompt.values()) == {4}
    newest = {it.seq for it in spool.holdout()}
    assert all(it.seq in newest for it in held)
