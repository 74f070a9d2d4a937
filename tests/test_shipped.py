"""The demo policy and drafter shipped with the project (gleanrl.shipped): the weights are the ones
hashed, the config is the recipe's, the recipe key is today's, a quick held-out figure clears its
floor; an altered file is refused. The last phase of the recipe (the focus polish) at tiny size."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from gleanrl import shipped
from gleanrl.harvest.checkpoint import load_drafter


def test_the_small_policy_and_drafter_load_and_check():
    policy = shipped.shipped_policy(sanity=False, size="small")
    accuracy = shipped.quick_heldout(policy)
    assert accuracy >= shipped.SANITY_FLOOR, accuracy
    drafter = load_drafter(shipped.shipped_drafter("small"), target_config=policy)
    assert drafter.config.target_hidden_size == 512
    size = (policy / "model.safetensors").stat().st_size + (
        shipped.SHIPPED["small"].drafter / "model.safetensors"
    ).stat().st_size
    assert size < 100e6  # fp32 policy (the trainer checkpoints fp32), bf16 drafter, no optimizer state


def test_the_deep_policy_is_shipped_in_bf16_and_checks():
    """The 32-layer policy on the self-check task: bf16 on disk (cast at load), the recipe's shape
    and key, a held-out figure over the floor, its warm-start drafter of its width."""
    entry = shipped.SHIPPED["deep"]
    assert shipped.DEFAULT == "deep"  # the demo's and the benches' policy (issue 38)
    policy = shipped.shipped_policy(sanity=False)
    assert policy == entry.policy and shipped.shipped_for(policy) == entry
    from safetensors import safe_open

    with safe_open(str(policy / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert shipped.quick_heldout(policy, task=entry.task) >= shipped.SANITY_FLOOR
    drafter = load_drafter(shipped.shipped_drafter(), target_config=policy)
    assert drafter.config.target_hidden_size == 256


def test_an_altered_shipped_file_is_refused(tmp_path, monkeypatch):
    policy = shipped.SHIPPED[shipped.DEFAULT].policy
    copy = tmp_path / policy.name
    shutil.copytree(policy, copy)
    sums = tmp_path / "SHA256SUMS"
    shutil.copy(shipped.sums_file(), sums)
    monkeypatch.setattr(shipped, "ROOT", tmp_path)
    assert shipped.shipped_policy(sanity=False) == copy
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(-2, 2)
        f.write(b"\x00\x01")
    with pytest.raises(shipped.ShippedError, match="sha256"):
        shipped.shipped_policy(sanity=False)
    sums.write_text("")
    with pytest.raises(shipped.ShippedError, match="missing"):
        shipped.shipped_policy(sanity=False)


def test_polish_phase_weights_the_focus_and_moves_the_weights():
    from gleanrl.trainer.bootstrap import SIZES
    from gleanrl.trainer.tasks import load_task
    from gleanrl.trainer.tasks.builtin import build_char_tokenizer
    from gleanrl.trainer.tasks.sft import build_model, polish_policy

    size = dataclasses.replace(SIZES["tiny"], polish_steps=3, polish_focus_weight=5.0)
    tokenizer = build_char_tokenizer()
    model = build_model(tokenizer, size, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model, curve = polish_policy(model, load_task("doubling"), tokenizer, size, seed=0, progress=False)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert curve == []  # 3 steps: no 25-step point
