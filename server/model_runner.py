"""The target model's forward over a ragged batch (no padding), reusing a transformers model's weights.

Works for the Llama family as transformers writes it (Llama, Qwen2, Qwen3: q/k/v projections with
optional bias, optional per-head q_norm/k_norm, rotary embeddings, grouped-query attention, gated MLP).
Sliding-window attention is not implemented (none of these models use it by default).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gleanrl.harvest.drafter import fuse_linears
from gleanrl.server.attention import decode_attention
from gleanrl.server.kv import SeqKVCache, ragged_attention
from gleanrl.server.kv_pool import DecodePlan, decode_plan, pooled_decode_attention
from gleanrl.server.sd.verify_attention import VerifyPlan, verify_attention, verify_plan

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return DTYPES[dtype]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [N, heads, d]; cos, sin: [N, d]."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


def check_supported(model: nn.Module) -> None:
    """Raise ValueError unless the model has the Llama-family layout this runner reimplements."""
    cfg, inner = model.config, getattr(model, "model", None)
    name = (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head") or not all(
            hasattr(layer.self_attn, p) for layer in inner.layers for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
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
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.qkv = [fuse_linears([a.q_proj, a.k_proj, a.v_proj]) for a in (layer.self_attn for layer in self.layers)]
        self.gate_up = [fuse_linears([m.gate_proj, m.up_proj]) if hasattr(m, "gate_proj") else None
                        for m in (layer.mlp for layer in self.layers)]

    @classmethod
    def load(cls, model_path: str, device: str = "cpu", dtype: str = "auto") -> ModelRunner:
        from transformers import AutoModelForCausalLM

        torch_dtype = resolve_dtype(dtype, device)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(device)
        return cls(model, device)

    def new_cache(self, capacity: int = 64) -> SeqKVCache:
        return SeqKVCache(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype, self.device, capacity)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, caches: list[SeqKVCache],
                seq_lens: list[int], capture_layers: list[int] | None = None, last_only: bool = True,
                tree_masks: list[torch.Tensor | None] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """token_ids, positions: [N] (the new tokens of all sequences, concatenated);
        returns logits [B, V] for each sequence's last new token (or [N, V] if not `last_only`) and,
        with `capture_layers=[a, b, c]`, aux hidden [N, 3*H]: the residual stream entering layers
        a+1, b+1, c+1 (= transformers' `output_hidden_states[a+1]`, ...) concatenated. `tree_masks`: per
        sequence None or a mask [t, t] among its new tokens (a draft tree, `gleanrl.server.sd.tree`)."""
        n = token_ids.shape[0]
        x = self.embed(token_ids)                                           # [N, H]
        cos, sin = self.rotary(x, positions[None])                          # [1, N, d]
        cos, sin = cos[0], sin[0]
        plan = decode_plan(caches, seq_lens) if tree_masks is None else None
        vplan = verify_plan(caches, seq_lens, tree_masks, self.num_heads // self.num_kv_heads, x.device) \
            if plan is None else None
        capture = {i + 1: None for i in capture_layers or []}
        if any(not 0 <= i < self.num_layers for i in capture):  # streams entering a layer; -1: the embedding
            raise ValueError(f"capture_layers must be in [-1, {self.num_layers - 2}], got {capture_layers}")
        for i, layer in enumerate(self.layers):
            if i in capture:
                capture[i] = x
            x = x + self._attention(layer, layer.input_layernorm(x), cos, sin, caches, i, seq_lens, n,
                                    plan or vplan, tree_masks)
            x = x + self._mlp(i, layer, layer.post_attention_layernorm(x))
        if plan is not None:  # the pooled path wrote K/V directly: advance the caches once, as append would
            for c in caches:
                c.length += 1
        if last_only:
            ends = torch.tensor(seq_lens, device=x.device).cumsum(0) - 1
            x = x[ends]
        logits = self.lm_head(self.norm(x))
        aux = torch.cat([capture[i + 1] for i in capture_layers], dim=-1) if capture_layers else None
        return logits.float(), aux

    def _mlp(self, index: int, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        if self.gate_up[index] is None:
            return layer.mlp(h)
        gate, up = F.linear(h, *self.gate_up[index]).chunk(2, dim=-1)
        return layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)

    def _attention(self, layer: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   caches: list[SeqKVCache], index: int, seq_lens: list[int], n: int,
                   plan: DecodePlan | VerifyPlan | None,
                   tree_masks: list[torch.Tensor | None] | None = None) -> torch.Tensor:
        attn = layer.self_attn
        nq, nkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = F.linear(h, *self.qkv[index]).split([nq, nkv, nkv], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)                        # [N, nh, d]
        k = k.view(n, self.num_kv_heads, self.head_dim)                     # [N, nkv, d]
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:                       # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if isinstance(plan, DecodePlan):  # a pure decode batch in the slot pool
            o = pooled_decode_attention(q, k, v, plan, index)
        elif plan is not None:  # a verify pass: a few tokens per sequence, one kernel for all
            o = verify_attention(q, k, v, caches, index, seq_lens, plan)
        elif n == len(caches) > 1 and tree_masks is None:  # a pure decode batch: one kernel for all sequences
            o = decode_attention(q, k, v, caches, index)
        else:
            o = ragged_attention(q, k, v, caches, index, seq_lens, tree_masks)   # [N, nh, d]
        return attn.o_proj(o.reshape(n, nq))
