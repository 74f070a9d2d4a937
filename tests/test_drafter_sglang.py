"""Our drafter checkpoint against the real SGLang (0.5.23, `.venv-sglang`, see shared/sglang-cpu):
its `LlamaForCausalLMEagle3` is built from our config.json, loads our safetensors with its own
`load_weights`, and its modules (fused qkv, rope, fused-residual RMSNorms, gate_up MLP, lm_head)
recompute our forward. Only RadixAttention is replaced, by plain causal attention. SGLang's venv
computes its side and saves the tensors; ours is computed here (gleanrl is not installed in SGLang's
venv). Skipped where that venv is absent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from gleanrl.harvest.checkpoint import load_drafter, save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.server.sd.drafter_forward import drafter_forward, new_draft_cache

ROOT = Path(__file__).resolve().parents[1]
SGLANG_PY = ROOT / ".venv-sglang" / "bin" / "python"

SCRIPT = r"""
import json, socket, sys, torch, torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaConfig
from sglang.test.layer_ut_utils import init_single_process_dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
init_single_process_dist(master_port=port)
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

def check(ckpt):
    config = json.load(open(ckpt + "/config.json"))
    model = LlamaForCausalLMEagle3(LlamaConfig(**config))
    model.load_weights(load_file(ckpt + "/model.safetensors").items())
    m, layer = model.model, model.model.layers[0]
    g = torch.Generator().manual_seed(0)
    T = 9
    ids = torch.randint(0, config["vocab_size"], (T,), generator=g)
    aux = torch.randn(T, m.fc.weight.shape[1], generator=g)
    pos = torch.arange(T)
    with torch.no_grad():
        h = m.fc(aux)                                   # LlamaModel.forward + LlamaDecoderLayer.forward, layer 0
        residual = h
        x = torch.cat([layer.input_layernorm(m.embed_tokens(ids)), layer.hidden_norm(h)], dim=-1)
        attn = layer.self_attn
        q, k, v = attn.forward_prepare_native(pos, x)
        nh, nkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        q, k, v = (t.view(T, n, d).transpose(0, 1) for t, n in ((q, nh), (k, nkv), (v, nkv)))
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0),
                                           is_causal=True, scale=attn.scaling)
        o, _ = attn.o_proj(o.transpose(0, 1).reshape(T, nh * d))
        y, residual = layer.post_attention_layernorm(o, residual)
        y = layer.mlp(y)
        to_logits, to_aux = m.norm(y, residual)
        logits = (to_logits @ model.lm_head.weight.T)[:, : config["draft_vocab_size"]]  # rows padded to 64
    torch.save({"ids": ids, "aux": aux, "to_aux": to_aux, "logits": logits}, ckpt + ".sglang.pt")
    return {
        "params": sorted(n for n, _ in model.named_parameters()),
        "hot_token_id": model.get_hot_token_id().tolist(),
        "aux_layers": model.config.eagle_config["eagle_aux_hidden_state_layer_ids"],
        "num_aux": m.num_aux_hidden_states,
    }

print(json.dumps([check(c) for c in sys.argv[1:]]))
"""


@pytest.mark.skipif(not SGLANG_PY.exists(), reason="real SGLang not installed in .venv-sglang")
def test_sglang_loads_and_recomputes_our_drafter(tiny_qwen2, tmp_path):
    keep = [0, 2, 5, 7, 11] + list(range(20, 300, 3))  # a reduced draft vocabulary exercises d2t
    three = init_drafter(tiny_qwen2, seed=2, aux_layer_ids=[0, 1, 2], draft_token_ids=keep)
    three.config.rope_theta = 500000.0  # not the default, so SGLang must read ours
    # 2 aux layers (SGLang 0.5.23 sizes fc by ids)
    two = init_drafter(tiny_qwen2, seed=3, aux_layer_ids=[-1, 1])
    paths = [str(save_drafter(d, tmp_path / name)) for d, name in ((three, "three"), (two, "two"))]
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".venv-sglang" / "shim")}
    proc = subprocess.run([str(SGLANG_PY), "-c", SCRIPT, *paths], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r3, r2 = json.loads(proc.stdout.strip().splitlines()[-1])
    # every parameter SGLang registers for the drafter is one our checkpoint fills
    # (midlayer -> layers.0)
    assert (
        r3["params"]
        == r2["params"]
        == sorted(
            [
                "lm_head.weight",
                "model.embed_tokens.weight",
                "model.fc.weight",
                "model.layers.0.hidden_norm.weight",
                "model.layers.0.input_layernorm.weight",
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.0.mlp.gate_up_proj.weight",
                "model.layers.0.post_attention_layernorm.weight",
                "model.layers.0.self_attn.o_proj.weight",
                "model.layers.0.self_attn.qkv_proj.weight",
                "model.norm.weight",
            ]
        )
    )
    for r, path in ((r3, paths[0]), (r2, paths[1])):
        theirs = torch.load(path + ".sglang.pt")
        ours = load_drafter(path)
        with torch.no_grad():
            mine = drafter_forward(
                ours,
                theirs["ids"],
                theirs["aux"],
                torch.arange(len(theirs["ids"])),
                [new_draft_cache(ours)],
                [len(theirs["ids"])],
            )
            assert float((theirs["to_aux"] - mine).abs().max()) < 1e-4
            assert float((theirs["logits"] - ours.draft_logits(mine)).abs().max()) < 1e-4
        assert r["hot_token_id"] == ours.draft_to_target().tolist()
    assert r3["hot_token_id"] == sorted(keep) and r2["hot_token_id"] == list(range(two.config.vocab_size))
    assert (r3["aux_layers"], r3["num_aux"], r2["aux_layers"], r2["num_aux"]) == ([0, 1, 2], 3, [-1, 1], 2)
