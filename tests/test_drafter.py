"""EAGLE-3 drafter: forward vs an independent reference, ragged cache, checkpoint format
and refusals."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from gleanrl.harvest.checkpoint import DrafterCheckpointError, load_drafter, save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.drafter_config import DrafterConfig, default_aux_layer_ids
from gleanrl.server.sd.drafter_forward import drafter_forward, new_draft_cache


@pytest.fixture(scope="module")
def drafter(tiny_qwen2):
    d = init_drafter(tiny_qwen2, seed=3)
    with torch.no_grad():  # non-trivial norms, so a swapped norm would show
        for p in d.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return d.eval()


def reference_forward(d, ids: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
    """Full-sequence causal forward of one sequence from transformers' Llama pieces. ids [T],
    aux [T, 3H]."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    c, L = d.config, d.midlayer

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * w

    r = aux @ d.fc.weight.T
    x = torch.cat([rms(d.embed_tokens.weight[ids], L.input_layernorm.weight), rms(r, L.hidden_norm.weight)], -1)

    def heads(W, n):  # -> [1, n, T, d]
        return (x @ W.T).view(len(ids), n, c.head_dim).transpose(0, 1)[None]

    q = heads(L.self_attn.q_proj.weight, c.num_attention_heads)
    k = heads(L.self_attn.k_proj.weight, c.num_key_value_heads)
    v = heads(L.self_attn.v_proj.weight, c.num_key_value_heads)
    rope = LlamaRotaryEmbedding(
        LlamaConfig(
            hidden_size=c.hidden_size,
            num_attention_heads=c.num_attention_heads,
            head_dim=c.head_dim,
            rope_theta=c.rope_theta,
        )
    )
    cos, sin = rope(x, torch.arange(len(ids))[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    rep = c.num_attention_heads // c.num_key_value_heads
    o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
    r1 = o[0].transpose(0, 1).reshape(len(ids), -1) @ L.self_attn.o_proj.weight.T + r
    y = rms(r1, L.post_attention_layernorm.weight)
    m = (F.silu(y @ L.mlp.gate_proj.weight.T) * (y @ L.mlp.up_proj.weight.T)) @ L.mlp.down_proj.weight.T
    return m + r1


def test_ragged_cached_forward_equals_full_forward(drafter):
    g = torch.Generator().manual_seed(0)
    H3 = 3 * drafter.config.target_hidden_size
    seqs = [
        (torch.randint(0, 300, (8,), generator=g), torch.randn(8, H3, generator=g)),
        (torch.randint(0, 300, (8,), generator=g), torch.randn(8, H3, generator=g)),
    ]
    # also exercises cache growth
    caches = [new_draft_cache(drafter, capacity=2), new_draft_cache(drafter, capacity=2)]
    outs = [[], []]
    with torch.no_grad():
        for chunk in ([5, 3], [1, 4], [2, 1]):
            starts = [c.length for c in caches]
            ids = torch.cat([seqs[b][0][starts[b] : starts[b] + n] for b, n in enumerate(chunk)])
            aux = torch.cat([seqs[b][1][starts[b] : starts[b] + n] for b, n in enumerate(chunk)])
            pos = torch.cat([torch.arange(starts[b], starts[b] + n) for b, n in enumerate(chunk)])
            h = drafter_forward(drafter, ids, aux, pos, caches, chunk)
            assert h.shape == (sum(chunk), drafter.config.hidden_size)
            for b, part in enumerate(h.split(chunk)):
                outs[b].append(part)
        for b, (ids, aux) in enumerate(seqs):
            torch.testing.assert_close(torch.cat(outs[b]), reference_forward(drafter, ids, aux), atol=1e-5, rtol=1e-4)


def test_hidden_input_of_drafter_width_skips_fc(drafter):
    ids, aux = torch.tensor([5, 9]), torch.randn(2, 3 * drafter.config.target_hidden_size)
    with torch.no_grad():
        a = drafter_forward(drafter, ids, aux, torch.arange(2), [new_draft_cache(drafter)], [2])
        b = drafter_forward(drafter, ids, drafter.fc(aux), torch.arange(2), [new_draft_cache(drafter)], [2])
    torch.testing.assert_close(a, b)


def test_reduced_draft_vocab_logits_map_to_target_ids(tiny_qwen2):
    keep = torch.tensor([3, 10, 11, 200, 7])
    d = init_drafter(tiny_qwen2, draft_token_ids=keep)
    h = torch.randn(4, d.config.hidden_size)
    full = d.logits(h)
    assert full.shape == (4, d.config.vocab_size)
    torch.testing.assert_close(full[:, keep.sort().values], d.draft_logits(h))
    outside = torch.ones(d.config.vocab_size, dtype=torch.bool)
    outside[keep] = False
    assert torch.isneginf(full[:, outside]).all()


def test_default_aux_layer_ids_follow_sglang():
    assert default_aux_layer_ids(32) == [1, 15, 28]  # entering layers 2, L//2, L-3
    assert default_aux_layer_ids(28) == [1, 13, 24]
    # SGLang's [1, 1, 0] collides on shallow targets
    ids = default_aux_layer_ids(4)
    assert ids[0] < ids[1] < ids[2] <= 2
    assert default_aux_layer_ids(3) == [0, 1] and default_aux_layer_ids(2) == [-1, 0]


def test_two_layer_target_gets_a_two_aux_layer_drafter(tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from gleanrl.harvest.capture import capture
    from gleanrl.harvest.train_step import make_optimizer, train_step
    from gleanrl.tiny import make_tiny_model

    target = make_tiny_model(tmp_path / "t", tokenizer=tiny_tokenizer, num_layers=2)
    d = load_drafter(save_drafter(init_drafter(target), tmp_path / "d"), target_config=target)
    assert d.config.aux_layer_ids == [-1, 0] and d.fc.in_features == 2 * d.config.target_hidden_size
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    samples = capture(model, [list(range(5, 17))], d.config.aux_layer_ids, topk=8)
    assert samples[0].aux_hidden.shape == (12, 2 * d.config.target_hidden_size)
    assert torch.isfinite(torch.tensor(train_step(d, make_optimizer(d), [s.tensors() for s in samples])["loss"]))


# What SGLang's LlamaForCausalLMEagle3 (python/sglang/srt/models/llama_eagle3.py, sgl-project/sglang
# main before 0.5.23) registers as parameters, and how its load_weights maps checkpoint names: q/k/v
# -> qkv_proj, gate/up -> gate_up_proj, then a `model.` prefix unless the name is top level; `d2t`
# is read as offsets, `t2d` skipped. SGLang 0.5.23 also renames `midlayer` -> `layers.0` (checked
# for real in test_drafter_sglang.py).
SGLANG_PARAMS = {
    "model.embed_tokens.weight",
    "model.fc.weight",
    "model.midlayer.self_attn.qkv_proj.weight",
    "model.midlayer.self_attn.o_proj.weight",
    "model.midlayer.mlp.gate_up_proj.weight",
    "model.midlayer.mlp.down_proj.weight",
    "model.midlayer.input_layernorm.weight",
    "model.midlayer.hidden_norm.weight",
    "model.midlayer.post_attention_layernorm.weight",
    "model.norm.weight",
    "lm_head.weight",
}
STACKED = [
    (".qkv_proj", ".q_proj"),
    (".qkv_proj", ".k_proj"),
    (".qkv_proj", ".v_proj"),
    (".gate_up_proj", ".gate_proj"),
    (".gate_up_proj", ".up_proj"),
]


def sglang_name(name: str) -> str | None:
    if "d2t" in name or "t2d" in name:
        return None
    for fused, part in STACKED:
        if part in name:
            name = name.replace(part, fused)
            break
    return name if name in SGLANG_PARAMS else f"model.{name}"


def test_checkpoint_matches_sglang_eagle3_format(drafter, tmp_path):
    from safetensors import safe_open

    save_drafter(drafter, tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    c = drafter.config
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == c.aux_layer_ids
    for field in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "draft_vocab_size",
        "target_hidden_size",
        "rms_norm_eps",
        "rope_theta",
    ):
        assert cfg[field] == getattr(c, field), field
    assert cfg["tie_word_embeddings"] is False
    with safe_open(str(tmp_path / "d" / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    mapped = {sglang_name(k) for k in shapes} - {None}
    assert mapped == SGLANG_PARAMS
    assert {"d2t", "t2d"} <= set(shapes)
    H, d = c.hidden_size, c.head_dim
    fused_qkv = sum(shapes[f"midlayer.self_attn.{p}_proj.weight"][0] for p in "qkv")
    # QKVParallelLinear rows
    assert fused_qkv == (c.num_attention_heads + 2 * c.num_key_value_heads) * d
    # attention input is 2H
    assert shapes["midlayer.self_attn.q_proj.weight"][1] == 2 * H
    assert shapes["fc.weight"] == (H, 3 * c.target_hidden_size)
    assert shapes["lm_head.weight"] == (c.draft_vocab_size, H)
    assert shapes["d2t"] == (c.draft_vocab_size,) and shapes["t2d"] == (c.vocab_size,)


def test_checkpoint_round_trip(drafter, tmp_path, tiny_qwen2):
    save_drafter(drafter, tmp_path / "d")
    back = load_drafter(tmp_path / "d", target_config=tiny_qwen2)
    assert back.config == drafter.config and not back.training
    for (k, a), (_, b) in zip(drafter.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize(
    "field,value,reason",
    [
        ("hidden_size", 96, "hidden size"),
        ("vocab_size", 500, "vocabulary size"),
        ("num_hidden_layers", 6, "layer count"),
    ],
)
def test_load_refuses_drafter_for_another_target(drafter, tmp_path, tiny_qwen2, field, value, reason):
    save_drafter(drafter, tmp_path / "d")
    target = json.loads((tiny_qwen2 / "config.json").read_text())
    target[field] = value
    with pytest.raises(DrafterCheckpointError, match=reason):
        load_drafter(tmp_path / "d", target_config=target)


def test_load_refuses_missing_or_corrupt_checkpoints(drafter, tmp_path):
    with pytest.raises(DrafterCheckpointError, match="does not exist"):
        load_drafter(tmp_path / "nothing")
    save_drafter(drafter, tmp_path / "d")
    weights = tmp_path / "d" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(DrafterCheckpointError, match="corrupt"):
        load_drafter(tmp_path / "d")
    (tmp_path / "d" / "config.json").write_text("{not json")
    with pytest.raises(DrafterCheckpointError, match="config"):
        load_drafter(tmp_path / "d")
    bad = drafter.config.to_json()
    bad["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 1, 0]
    (tmp_path / "d" / "config.json").write_text(json.dumps(bad))
    with pytest.raises(DrafterCheckpointError, match="increasing"):
        load_drafter(tmp_path / "d")


def test_config_json_round_trip_and_specforge_style_config(drafter):
    c = drafter.config
    assert DrafterConfig.from_json(c.to_json()) == c
    sf = {k: v for k, v in c.to_json().items() if k not in ("target_hidden_size", "target_num_hidden_layers")}
    back = DrafterConfig.from_json(sf)  # SpecForge omits these when equal / unknown
    assert back.target_hidden_size == c.hidden_size and back.target_num_hidden_layers is None


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_qwen3"])
def test_init_for_other_architectures(request, fixture, tmp_path):
    target = request.getfixturevalue(fixture)
    d = init_drafter(target, seed=0)
    back = load_drafter(save_drafter(d, tmp_path / "d"), target_config=target)
    h = drafter_forward(
        back,
        torch.tensor([1, 2, 3]),
        torch.randn(3, 3 * d.config.hidden_size),
        torch.arange(3),
        [new_draft_cache(back)],
        [3],
    )
    assert torch.isfinite(back.logits(h)).all()


def test_init_copies_target_embedding_and_head(tiny_qwen2, tiny_tokenizer, tmp_path):
    from safetensors.torch import load_file

    from gleanrl.tiny import make_tiny_model

    weights = load_file(str(tiny_qwen2 / "model.safetensors"))
    d = init_drafter(tiny_qwen2)
    assert torch.equal(d.embed_tokens.weight, weights["model.embed_tokens.weight"])
    assert torch.equal(d.lm_head.weight, weights["lm_head.weight"])
    assert not d.embed_tokens.weight.requires_grad
    tied = make_tiny_model(tmp_path / "tied", tokenizer=tiny_tokenizer, tie_word_embeddings=True)
    d = init_drafter(tied)
    assert torch.equal(d.lm_head.weight, d.embed_tokens.weight)


def test_load_shares_the_targets_embedding_and_reads_specforge_checkpoints(drafter, tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_drafter(drafter, tmp_path / "d")
    target_embed = drafter.embed_tokens.weight.detach().clone() + 1.0
    back = load_drafter(path, embed_tokens=target_embed)
    assert torch.equal(back.embed_tokens.weight, target_embed)
    # an in-place policy update reaches the drafter
    target_embed.add_(1.0)
    assert torch.equal(back.embed_tokens.weight, target_embed)
    state = load_file(str(path / "model.safetensors"))  # SpecForge omits the embedding
    del state["embed_tokens.weight"]
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(DrafterCheckpointError, match="embed_tokens"):
        load_drafter(path)
    assert torch.equal(load_drafter(path, embed_tokens=target_embed).embed_tokens.weight, target_embed)
    with pytest.raises(DrafterCheckpointError, match="embedding of shape"):
        load_drafter(path, embed_tokens=torch.zeros(3, 3))
