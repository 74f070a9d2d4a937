"""The target model's forward over a ragged batch (no padding), reusing a transformers model's weights.

Works for the Llama family as transformers writes it (Llama, Qwen2, Qwen3: q/k/v projections with optional bias,
optional per-head q_norm/k_norm, rotary embeddings, grouped-query attention, gated MLP). Sliding-window attention is not
implemented (none of these models use it by default)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from gleanrl.harvest.drafter import fuse_linears
from gleanrl.server.model.attention import advance_caches, attention, plan_attention
from gleanrl.server.model.kv import Masks, SeqKVCache
from gleanrl.server.model.packed_linear import can_pack, linear, transposed_layout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def rotary_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, d] (transformers' layout: two equal halves) -> [N, 1, d] tables for
    `apply_rotary`, the sine's first half negated, so that rotating half of x is one `roll`."""
    half = sin.shape[-1] // 2
    return cos[:, None], torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [N, heads, d]; tables from `rotary_tables`. transformers' `x * cos + rotate_half(x) * sin`, the same products
    and sum (bit for bit), in four kernels instead of eight."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' Llama/Qwen RMSNorm (normalise in float32, round to the input's dtype, then
    scale) with one fused kernel for the normalisation; in float32 the scale too (no rounding between: the same
    products, bit for bit, one op fewer)."""
    if x.dtype == norm.weight.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)
    return F.rms_norm(x.float(), x.shape[-1:], eps=norm.variance_epsilon).to(x.dtype) * norm.weight


def check_supported(model: nn.Module) -> None:
    """Raise ValueError unless the model has the Llama-family layout this runner reimplements."""
    cfg, inner = model.config, getattr(model, "model", None)
    name = (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    llama = inner is not None and all(hasattr(inner, p) for p in parts) and hasattr(model, "lm_head")
    if not llama or not all(hasattr(layer.self_attn, p) for layer in inner.layers for p in projections):
        raise ValueError(f"{name} is not supported by the embedded engine (Llama, Qwen2 and Qwen3-style models are)")
    if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        raise ValueError(f"{name} with sliding-window attention is not supported by the embedded engine")


class ModelRunner:
    """Holds one loaded causal LM and runs ragged forwards with per-sequence KV caches."""

    def __init__(self, model: nn.Module, device: str = "cpu"):
        check_supported(model)
        self.model = model.eval()
        self.device = torch.device(device)
        self.config = model.config
        self.dtype = next(model.parameters()).dtype
        inner = model.model
        self.embed, self.layers, self.norm, self.rotary = inner.embed_tokens, inner.layers, inner.norm, inner.rotary_emb
        self.lm_head = model.lm_head
        cfg = self.config
        self.num_layers = len(self.layers)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.hidden_size, self.vocab_size = cfg.hidden_size, cfg.vocab_size
        attns, mlps = [la.self_attn for la in self.layers], [la.mlp for la in self.layers]
        transposed = transposed_layout(self.dtype, self.device)
        qkv = [fuse_linears([a.q_proj, a.k_proj, a.v_proj], transposed) for a in attns]
        gate_up = [
            fuse_linears([m.gate_proj, m.up_proj], transposed) if hasattr(m, "gate_proj") else None for m in mlps
        ]
        plain = [(a.o_proj.weight, a.o_proj.bias) for a in attns] + [(self.lm_head.weight, self.lm_head.bias)]
        plain += [(m.down_proj.weight, m.down_proj.bias) for m, gu in zip(mlps, gate_up) if gu is not None]
        pack = can_pack([w for w, _ in qkv + plain + [gu for gu in gate_up if gu is not None]])
        self.qkv = [linear(w, b, pack) for w, b in qkv]
        self.o_proj = [linear(a.o_proj.weight, a.o_proj.bias, pack) for a in attns]
        self.gate_up = [linear(*gu, pack) if gu is not None else None for gu in gate_up]
        self.down = [linear(m.down_proj.weight, m.down_proj.bias, pack) if gu else None for m, gu in zip(mlps, gate_up)]
        self.logits = linear(self.lm_head.weight, self.lm_head.bias, pack)
        self.silu = getattr(cfg, "hidden_act", None) == "silu"
        self.forward_seconds = 0.0  # wall time inside `forward`, cumulative (a bench reads it)

    @classmethod
    def load(cls, model_path: str, device: str = "cpu", dtype: str = "auto") -> ModelRunner:
        from transformers import AutoModelForCausalLM

        auto = torch.float32 if device == "cpu" else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=auto if dtype == "auto" else DTYPES[dtype])
        return cls(model.to(device), device)

    def new_cache(self, capacity: int = 64) -> SeqKVCache:
        return SeqKVCache(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype, self.device, capacity)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        caches: list[SeqKVCache],
        seq_lens: list[int],
        capture_layers: list[int] | None = None,
        last_only: bool = True,
        tree_masks: Masks = None,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """token_ids, positions: [N] (the new tokens of all sequences, concatenated); returns logits [B, V] for each
        sequence's last new token (or [N, V] if not `last_only`, or [R, V] of the new tokens' `rows` [R]) and, with
        `capture_layers=[a, b, c]`, aux hidden [N, 3*H]: the residual stream entering layers a+1, b+1, c+1 (=
        transformers' `output_hidden_states[a+1]`, ...) concatenated. `tree_masks`: `kv.Masks` (draft trees,
        `gleanrl.server.sd.tree_pass`)."""
        t0 = time.perf_counter()
        n = token_ids.shape[0]
        x = self.embed(token_ids)  # [N, H]
        cos, sin = self.rotary(x, positions[None])  # [1, N, d]
        rot = rotary_tables(cos[0], sin[0])  # [N, 1, d] each
        plan = plan_attention(caches, seq_lens, tree_masks, self.num_heads // self.num_kv_heads, x.device)
        capture = {i + 1: None for i in capture_layers or []}  # streams entering a layer; -1: the embedding
        if any(not 0 <= i < self.num_layers for i in capture):
            raise ValueError(f"capture_layers must be in [-1, {self.num_layers - 2}], got {capture_layers}")
        nh, nkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        for i, layer in enumerate(self.layers):
            if i in capture:
                capture[i] = x
            attn, qkv = layer.self_attn, self.qkv[i](rms_norm(layer.input_layernorm, x))  # [N, (nh + 2 nkv) d]
            v = qkv[:, (nh + nkv) * d :].view(n, nkv, d)  # [N, nkv, d]
            if getattr(attn, "q_norm", None) is not None:  # Qwen3: per-head norms first
                q = apply_rotary(rms_norm(attn.q_norm, qkv[:, : nh * d].view(n, nh, d)), *rot)
                k = apply_rotary(rms_norm(attn.k_norm, qkv[:, nh * d : (nh + nkv) * d].view(n, nkv, d)), *rot)
            else:  # q and k rotated in one go
                q, k = apply_rotary(qkv[:, : (nh + nkv) * d].view(n, nh + nkv, d), *rot).split([nh, nkv], dim=1)
            o = attention(q, k, v, caches, i, seq_lens, plan, tree_masks)  # [N, nh, d]
            x = x + self.o_proj[i](o.reshape(n, nh * d))
            x = x + self._mlp(i, layer, rms_norm(layer.post_attention_layernorm, x))
        advance_caches(plan, caches, seq_lens)
        if rows is not None:
            x = x[rows]
        elif last_only and n != len(seq_lens):
            x = x[torch.tensor(seq_lens, device=x.device).cumsum(0) - 1]  # each sequence's last new token
        logits = self.logits(rms_norm(self.norm, x)).float()
        aux = torch.cat([capture[i + 1] for i in capture_layers], dim=-1) if capture_layers else None
        self.forward_seconds += time.perf_counter() - t0
        return logits, aux

    def _mlp(self, index: int, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        if self.gate_up[index] is None:
            return layer.mlp(h)
        gate, up = self.gate_up[index](h).chunk(2, dim=-1)
        return self.down[index]((F.silu(gate) if self.silu else layer.mlp.act_fn(gate)) * up)
