"""Header-level push guard: every bad-push case stock SGLang mishandles is refused here, on disk."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from gleanrl.harvest.checkpoint_check import (
    CheckpointMismatch,
    check_policy_checkpoint,
    read_safetensors_header,
    read_tensor_specs,
)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_same_layout_other_weights_is_accepted(tiny_qwen2, tiny_qwen2_b):
    specs = check_policy_checkpoint(tiny_qwen2_b, tiny_qwen2)
    assert "model.embed_tokens.weight" in specs and specs["model.embed_tokens.weight"].dtype == "F32"


def test_truncated_safetensors_is_refused(tiny_qwen2, tmp_path):
    bad = _copy(tiny_qwen2, tmp_path / "bad")
    f = bad / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointMismatch, match="truncated"):
        check_policy_checkpoint(bad, tiny_qwen2)
    f.write_bytes(b"\x10\x00")
    with pytest.raises(CheckpointMismatch, match="truncated"):
        read_safetensors_header(f)


def test_garbled_header_is_refused(tiny_qwen2, tmp_path):
    bad = _copy(tiny_qwen2, tmp_path / "bad")
    f = bad / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:12] = b"\xff\xfe\x00\x01"
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointMismatch, match="corrupt"):
        check_policy_checkpoint(bad, tiny_qwen2)


def test_other_architecture_is_refused(tiny_qwen2, tiny_llama):
    with pytest.raises(CheckpointMismatch, match="architectures"):
        check_policy_checkpoint(tiny_llama, tiny_qwen2)


def test_config_lie_is_caught_by_tensor_names(tiny_qwen2, tiny_llama, tmp_path):
    """Llama weights behind a Qwen2 config.json: the tensor names (no q/k/v bias) give it away."""
    bad = _copy(tiny_llama, tmp_path / "bad")
    (bad / "config.json").write_text((tiny_qwen2 / "config.json").read_text())
    with pytest.raises(CheckpointMismatch, match="tensor names differ"):
        check_policy_checkpoint(bad, tiny_qwen2)


def test_wrong_shape_and_dtype_are_refused(tiny_qwen2, tmp_path):
    specs = read_tensor_specs(tiny_qwen2)
    name = "model.norm.weight"
    for change, why in [
        (lambda t: torch.zeros(t.shape[0] + 1), "model.norm.weight"),
        (lambda t: t.to(torch.int32), "I32"),
    ]:
        bad = _copy(tiny_qwen2, tmp_path / f"bad_{why}")
        from safetensors.torch import load_file

        state = load_file(bad / "model.safetensors")
        state[name] = change(state[name])
        save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(CheckpointMismatch, match=why):
            check_policy_checkpoint(bad, tiny_qwen2)
    assert specs[name].shape == (64,)
    # a float dtype is cast to the serving one at load: a bf16 checkpoint updates a float32 model
    # (and a float32 one a model shipped in bf16)
    from safetensors.torch import load_file

    half = _copy(tiny_qwen2, tmp_path / "bf16")
    state = load_file(half / "model.safetensors")
    save_file(
        {k: v.to(torch.bfloat16) for k, v in state.items()}, half / "model.safetensors", metadata={"format": "pt"}
    )
    assert check_policy_checkpoint(half, tiny_qwen2)[name].dtype == "BF16"
    assert check_policy_checkpoint(tiny_qwen2, half)[name].dtype == "F32"


def test_missing_dir_and_config_are_refused(tiny_qwen2, tmp_path):
    with pytest.raises(CheckpointMismatch, match="no config.json"):
        check_policy_checkpoint(tmp_path / "nope", tiny_qwen2)
    bad = _copy(tiny_qwen2, tmp_path / "nofiles")
    (bad / "model.safetensors").unlink()
    with pytest.raises(CheckpointMismatch, match="no safetensors"):
        check_policy_checkpoint(bad, tiny_qwen2)


def test_sharded_checkpoint_with_missing_shard(tiny_qwen2, tmp_path):
    from safetensors.torch import load_file

    state = load_file(tiny_qwen2 / "model.safetensors")
    names = sorted(state)
    shard = _copy(tiny_qwen2, tmp_path / "sharded")
    (shard / "model.safetensors").unlink()
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in halves.items():
        save_file({k: state[k] for k in keys}, shard / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (shard / "model.safetensors.index.json").write_text(json.dumps(index))
    assert set(check_policy_checkpoint(shard, tiny_qwen2)) == set(names)
    (shard / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointMismatch, match="missing"):
        check_policy_checkpoint(shard, tiny_qwen2)


def test_a_drafter_is_never_a_policy(tiny_qwen2, tmp_path):
    from gleanrl.harvest.checkpoint import save_drafter
    from gleanrl.harvest.drafter import Eagle3Drafter
    from gleanrl.harvest.drafter_config import DrafterConfig

    cfg = json.loads((tiny_qwen2 / "config.json").read_text())
    drafter = save_drafter(Eagle3Drafter(DrafterConfig.for_target(cfg)), tmp_path / "drafter")
    with pytest.raises(CheckpointMismatch, match="EAGLE-3 drafter"):
        check_policy_checkpoint(drafter, tiny_qwen2)
