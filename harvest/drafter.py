"""The EAGLE-3 drafter: computes what SGLang's `LlamaForCausalLMEagle3` (models/llama_eagle3.py) computes.

    r   = fc(concat(aux_a, aux_b, aux_c))          fc only when the hidden input is n*Ht wide (n aux layers)
    x   = concat(input_layernorm(embed(tok)), hidden_norm(r))                          [N, 2H]
    r1  = o_proj(attn(q, k, v from x, rope at `positions`)) + r
    h   = mlp(post_attention_layernorm(r1)) + r1    -> returned, pre-norm ("aux" in SGLang)
    logits = lm_head(norm(h))                       over the draft vocab; target id = draft id + d2t[id]

Alignment (as SGLang and SpecForge): position i pairs the target's h_i (which predicted token i+1) with
embed(token_{i+1}) and predicts token i+2, at rope position i. The next draft step feeds the drafter's own `h`
with the drafted token at i+1. The embedding is the target's (SGLang shares it; we also store a frozen copy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from gleanrl.harvest.drafter_config import DrafterConfig

Linear = Callable[[torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # computed in float32 whatever the weights' dtype
        return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(x.dtype)


def fuse_linears(linears: list[nn.Linear], transposed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for linears sharing their input; their parameters become views into it. `transposed`: the
    weight [out, in] is held as [in, out] in memory (a transposed view: the same values, another layout; see
    `gleanrl.server.model.packed_linear.transposed_layout`)."""
    weight = torch.cat([lin.weight.data for lin in linears])
    weight = weight.t().contiguous().t() if transposed else weight
    bias = None
    if any(lin.bias is not None for lin in linears):
        bias = torch.cat(
            [lin.bias.data if lin.bias is not None else weight.new_zeros(lin.out_features) for lin in linears]
        )
    start = 0
    for lin in linears:
        end = start + lin.out_features
        lin.weight.data = weight[start:end]
        if lin.bias is not None:
            lin.bias.data = bias[start:end]
        start = end
    return weight, bias


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor, theta: float, inv_freq: torch.Tensor | None = None
) -> torch.Tensor:
    """x: [..., n_heads, d]; positions: [...] (broadcast over heads). Neox-style halves, as Llama."""
    d = x.shape[-1]
    inv_freq = rope_inv_freq(d, theta).to(x.device) if inv_freq is None else inv_freq
    ang = positions.float()[..., None, None] * inv_freq  # [..., 1, d/2]
    cos, sin = ang.cos(), ang.sin()
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class Eagle3Drafter(nn.Module):
    """Parameter names are the checkpoint's keys (SGLang maps them under `model.`). The serving
    forward over per-sequence KV caches is the server's (`gleanrl.server.sd.drafter_forward`)."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the target's embedding, frozen
        self.fc = nn.Linear(len(c.aux_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool))
        self.register_buffer("inv_freq", rope_inv_freq(c.head_dim, c.rope_theta), persistent=False)
        self.fused: tuple[torch.Tensor, torch.Tensor] | None = None  # (qkv, gate_up) weights when serving
        self.serving: dict[str, Linear] | None = None

    def fuse_for_inference(
        self, make_linear: Callable[[torch.Tensor], Linear] | None = None, transposed: bool = False
    ) -> Eagle3Drafter:
        """Serve with one q/k/v and one gate/up matmul (after the last `.to()`; training unaffected).
        `make_linear(weight)` builds each x -> x @ weight.T (default `F.linear`; the server passes oneDNN-packed
        copies, which in-place updates do not reach); `transposed`: the fused weights' layout (`fuse_linears`)."""
        make = make_linear or (lambda w: lambda x: F.linear(x, w))
        layer = self.midlayer
        self.fused = (
            fuse_linears([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], transposed)[0],
            fuse_linears([layer.mlp.gate_proj, layer.mlp.up_proj], transposed)[0],
        )
        self.serving = {
            "fc": make(self.fc.weight),
            "qkv": make(self.fused[0]),
            "o": make(layer.self_attn.o_proj.weight),
            "gate_up": make(self.fused[1]),
            "down": make(layer.mlp.down_proj.weight),
            "lm_head": make(self.lm_head.weight),
        }
        return self

    def share_embedding(self, weight: torch.Tensor) -> None:
        """Use the target's embedding [V, H] itself, as SGLang does (`set_embed`): in-place updates reach it."""
        have, need = tuple(weight.shape), tuple(self.embed_tokens.weight.shape)
        if have != need:
            raise ValueError(f"embedding of shape {have}, the drafter needs {need}")
        self.embed_tokens.weight = nn.Parameter(weight.detach(), requires_grad=False)  # shares storage

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """target_ids [V_draft]: the target ids of the draft vocabulary, strictly increasing."""
        ids = target_ids.to(self.d2t.device, torch.long)
        self.d2t.copy_(ids - torch.arange(ids.shape[0], device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., n*Ht] target aux states -> fc -> [..., H]; a [..., H] drafter state passes through."""
        if hidden.shape[-1] == self.config.hidden_size:
            return hidden
        return self.serving["fc"](hidden) if self.serving else self.fc(hidden)

    def qkv(self, input_ids: torch.Tensor, r: torch.Tensor, positions: torch.Tensor):
        """input_ids [...]; r [..., H]; positions [...] -> q [..., nh, d], k, v [..., nkv, d] (roped)."""
        c, layer = self.config, self.midlayer
        x = torch.cat([layer.input_layernorm(self.embed_tokens(input_ids)), layer.hidden_norm(r)], dim=-1)
        nq, nkv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        if self.serving is not None:
            qk, v = self.serving["qkv"](x).split([nq + nkv, nkv], dim=-1)
        else:
            qk = torch.cat([layer.self_attn.q_proj(x), layer.self_attn.k_proj(x)], dim=-1)
            v = layer.self_attn.v_proj(x)
        qk = qk.unflatten(-1, (c.num_attention_heads + c.num_key_value_heads, c.head_dim))
        qk = apply_rope(qk, positions, c.rope_theta, self.inv_freq)  # q and k in one go
        q, k = qk.split([c.num_attention_heads, c.num_key_value_heads], dim=-2)
        return q, k, v.unflatten(-1, (c.num_key_value_heads, c.head_dim))

    def finish(self, attn: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """attn [..., nh, d]; r [..., H] (the projected input) -> pre-norm output h [..., H]."""
        layer, mm = self.midlayer, self.serving
        if mm is None:
            r1 = layer.self_attn.o_proj(attn.flatten(-2)) + r
            return layer.mlp(layer.post_attention_layernorm(r1)) + r1
        r1 = mm["o"](attn.flatten(-2)) + r
        gate, up = mm["gate_up"](layer.post_attention_layernorm(r1)).chunk(2, dim=-1)
        return mm["down"](F.silu(gate) * up) + r1

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] pre-norm -> [..., V_draft]."""
        return (self.serving["lm_head"] if self.serving else self.lm_head)(self.norm(h))

    def draft_to_target(self) -> torch.Tensor:
        """[V_draft] target id of each draft id (SGLang's hot_token_id)."""
        return self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> [N, V_target]; target ids outside the draft vocabulary get -inf."""
        dl = self.draft_logits(h)
        if self.config.draft_vocab_size == self.config.vocab_size:  # d2t all zeros (checked on load)
            return dl
        out = dl.new_full((*dl.shape[:-1], self.config.vocab_size), float("-inf"))
        out[..., self.draft_to_target()] = dl
        return out
