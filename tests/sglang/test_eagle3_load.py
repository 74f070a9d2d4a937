"""The drafter directory gleanrl writes, loaded by SGLang's own `LlamaForCausalLMEagle3` on CPU
(built in SGLang's venv with a single-process gloo group) through its `load_weights`: every
parameter of SGLang's module is filled, with exactly the checkpoint's values, and no checkpoint
tensor is dropped except `t2d` (which SGLang skips by design). SGLang's EAGLE-3 *forward* needs its
GPU attention backends and is not run here; tests/test_drafter*.py check gleanrl's forward against
the same source by construction.

Also reproduced: what a policy push through /update_weights_from_disk does to the draft runner of an
SD server (SGLang sends the same path to every runner): `load_weights` overwrites part of the
drafter with policy tensors, then fails on a shape."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from sglang_util import free_port, run_in_sglang

pytestmark = pytest.mark.sglang

LOAD = r"""
import json, sys, torch
from safetensors.torch import load_file
from sglang.test.layer_ut_utils import init_single_process_dist
init_single_process_dist(master_port=int(sys.argv[2]))
from transformers import LlamaConfig
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
out = []
for config_dir, weights_dir in json.loads(sys.argv[1]):   # [(drafter config dir, dir whose weights to load)]
    model = LlamaForCausalLMEagle3(LlamaConfig.from_pretrained(config_dir))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    weights = load_file(weights_dir + "/model.safetensors")
    error = None
    try:
        model.load_weights(list(weights.items()))      # file order, as SGLang's disk loader iterates
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    hot = model.hot_token_id
    out.append({"error": error,
                "params": {n: {"shape": list(p.shape), "filled": bool(not p.isnan().any()),
                               "touched": bool(not p.isnan().all()),
                               "sum": float(p.detach().double().nan_to_num().sum())}
                           for n, p in model.named_parameters()},
                "hot_token_id": None if hot is None else hot.tolist()})
print(json.dumps(out))
"""

# checkpoint names -> SGLang parameter (from sglang/srt/models/llama_eagle3.py `load_weights`:
# "midlayer" becomes "layers.0", a "model." prefix is added, q/k/v and gate/up are
# stacked in this order)
EXPECTED = {
    "model.embed_tokens.weight": ["embed_tokens.weight"],
    "model.fc.weight": ["fc.weight"],
    "model.layers.0.self_attn.qkv_proj.weight": [
        "midlayer.self_attn.q_proj.weight",
        "midlayer.self_attn.k_proj.weight",
        "midlayer.self_attn.v_proj.weight",
    ],
    "model.layers.0.self_attn.o_proj.weight": ["midlayer.self_attn.o_proj.weight"],
    "model.layers.0.mlp.gate_up_proj.weight": ["midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight"],
    "model.layers.0.mlp.down_proj.weight": ["midlayer.mlp.down_proj.weight"],
    "model.layers.0.input_layernorm.weight": ["midlayer.input_layernorm.weight"],
    "model.layers.0.hidden_norm.weight": ["midlayer.hidden_norm.weight"],
    "model.layers.0.post_attention_layernorm.weight": ["midlayer.post_attention_layernorm.weight"],
    "model.norm.weight": ["norm.weight"],
    "lm_head.weight": ["lm_head.weight"],
}


@pytest.fixture(scope="module")
def loaded(drafter_dir, full_vocab_drafter_dir, tiny_qwen2):
    """One SGLang-side run (importing SGLang is the slow part): [drafter into its own
    weights, the policy's weights into a full-vocabulary drafter]."""
    jobs = [(str(drafter_dir), str(drafter_dir)), (str(full_vocab_drafter_dir), str(tiny_qwen2))]
    return run_in_sglang(LOAD, json.dumps(jobs), str(free_port()))


@pytest.fixture(scope="module")
def full_vocab_drafter_dir(tiny_qwen2, tmp_path_factory):
    from gleanrl.harvest.checkpoint import save_drafter
    from gleanrl.harvest.drafter import Eagle3Drafter
    from gleanrl.harvest.drafter_config import DrafterConfig

    cfg = json.loads((tiny_qwen2 / "config.json").read_text())
    return save_drafter(Eagle3Drafter(DrafterConfig.for_target(cfg)), tmp_path_factory.mktemp("eagle3") / "full")


@pytest.fixture(scope="module")
def drafter_dir(tiny_qwen2, tmp_path_factory):
    from gleanrl.harvest.checkpoint import save_drafter
    from gleanrl.harvest.drafter import Eagle3Drafter
    from gleanrl.harvest.drafter_config import DrafterConfig

    cfg = json.loads((tiny_qwen2 / "config.json").read_text())
    torch.manual_seed(0)
    drafter = Eagle3Drafter(DrafterConfig.for_target(cfg, draft_vocab_size=96))
    # a non-trivial draft vocabulary: draft id i -> target id 3i
    drafter.set_draft_vocab(torch.arange(96) * 3)
    return save_drafter(drafter, tmp_path_factory.mktemp("eagle3") / "drafter")


def test_sglang_eagle3_loads_every_drafter_tensor(drafter_dir, loaded):
    got = loaded[0]
    assert got["error"] is None
    state = load_file(drafter_dir / "model.safetensors")
    # no SGLang parameter unaccounted for
    assert set(got["params"]) == set(EXPECTED)
    used = {name for names in EXPECTED.values() for name in names}
    assert set(state) - used == {"d2t", "t2d"}  # nothing else dropped
    for param, names in EXPECTED.items():
        expected = torch.cat([state[n] for n in names], dim=0)
        row = got["params"][param]
        assert row["filled"], f"{param} was not loaded"
        # ParallelLMHead pads its rows to a multiple of 64 (zeros); the rest must match exactly
        assert (
            row["shape"][1:] == list(expected.shape[1:])
            and expected.shape[0] <= row["shape"][0] < expected.shape[0] + 64
        ), param
        assert abs(row["sum"] - float(expected.double().sum())) < 1e-6 * (1 + float(expected.double().abs().sum())), (
            param
        )
    assert got["hot_token_id"] == (state["d2t"] + torch.arange(96)).tolist() == (torch.arange(96) * 3).tolist()


def test_policy_weights_sent_to_the_draft_runner_corrupt_it_then_fail(loaded):
    """With a full-size draft vocabulary the policy's lm_head/embedding/MLP fit and are written into
    the drafter before the attention projections (2H wide in the drafter) fail. With a smaller draft
    vocabulary the first tensor already fails. Either way SGLang's rollback then re-reads the same
    new path (its model_path was already switched) and fails again, inside the scheduler."""
    got = loaded[1]
    assert got["error"] is not None and "shape" in got["error"]
    overwritten = sorted(n for n, row in got["params"].items() if row["touched"])
    print(
        f"\n[sglang] policy into LlamaForCausalLMEagle3.load_weights: {got['error'][:120]}; "
        f"overwritten before failing: {overwritten}"
    )
    # partially overwritten drafter
    assert overwritten
