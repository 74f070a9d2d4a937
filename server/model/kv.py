"""Per-sequence KV cache and ragged attention, shared by the target model runner and the drafter.

A batch is ragged: sequence i contributes `seq_lens[i]` new tokens, concatenated along dim 0 (no padding). New
keys/values are appended to each sequence's own cache; queries attend causally to everything before them in that
sequence. Rolling back rejected draft tokens is `truncate(n)`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

Masks = list[Tensor | None] | None  # per sequence None or a mask [t, t] among its new tokens (a draft tree)


def sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """`F.scaled_dot_product_attention` over 4-D inputs [B, heads, q_len, d]. With one query row in bf16/fp16 on CPU the
    query is doubled and one row kept: SDPA's CPU flash kernel is 2-3x slower for one query than for two in reduced
    precision (docs/engine.md, "One query per sequence"); a row's output does not depend on the other rows: the same
    attention, rounded as SDPA rounds a two-row call."""
    if q.shape[-2] == 1 and not is_causal and q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        o = F.scaled_dot_product_attention(torch.cat((q, q), -2), k, v, attn_mask=attn_mask)
        return o[..., :1, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def decode_sdpa(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """One new token per sequence: q [B, n_heads, d] over keys, values [B, n_kv, L, d]; returns [B, n_heads, d]."""
    b, n_heads, d = q.shape
    qg = q.view(b, keys.shape[1], n_heads // keys.shape[1], d)  # query heads sharing a KV head: head h uses h // group
    return sdpa(qg, keys, values, attn_mask=mask).reshape(b, n_heads, d)


def length_mask(lens: list[int], device: torch.device | str) -> Tensor | None:
    """[B, 1, 1, L_max], True below each length; None when the lengths are equal."""
    if min(lens) == max(lens):
        return None
    return (torch.arange(max(lens), device=device)[None] < torch.tensor(lens, device=device)[:, None])[:, None, None]


def append_padded(
    caches: list[SeqKVCache], layer: int, k: Tensor, v: Tensor, seq_lens: list[int]
) -> tuple[Tensor, Tensor]:
    """k, v: [N, n_kv, d], `seq_lens[i]` new tokens of sequence i. Appends them to the caches; returns every cache's
    keys and values padded into [B, n_kv, L_max, d] (a copy, done in C++)."""
    keys, values, start = [], [], 0
    for cache, t in zip(caches, seq_lens):
        ks, vs = cache.append(layer, k[start : start + t].transpose(0, 1), v[start : start + t].transpose(0, 1))
        keys.append(ks.transpose(0, 1))  # [L_i, n_kv, d]
        values.append(vs.transpose(0, 1))
        start += t
    return pad_sequence(keys, batch_first=True).transpose(1, 2), pad_sequence(values, batch_first=True).transpose(1, 2)


class SeqKVCache:
    """Keys and values of one sequence for every layer: buffers [n_kv_heads, capacity, head_dim]."""

    def __init__(
        self,
        num_layers: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        capacity: int = 64,
    ):
        self.length = 0  # tokens whose K/V are valid (same for every layer once a forward completes)
        self.pool, self.slot = None, 0  # the kv_pool.KVPool whose slot holds k and v, if any
        self._shape = (n_kv_heads, capacity, head_dim)
        self.k = [torch.empty(self._shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(self._shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def _reserve(self, layer: int, needed: int) -> None:
        cap = self.k[layer].shape[1]
        if needed <= cap:
            return
        new_cap = max(needed, 2 * cap)
        for buf in (self.k, self.v):
            old = buf[layer]
            grown = old.new_empty((old.shape[0], new_cap, old.shape[2]))
            grown[:, :cap] = old
            buf[layer] = grown

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v: [n_kv_heads, t, head_dim] for the t new tokens. Returns all keys/values [n_kv, L+t, d]. `length`
        advances only after the last layer, so every layer appends at the same offset."""
        start, end = self.length, self.length + k.shape[1]
        self._reserve(layer, end)
        self.k[layer][:, start:end] = k
        self.v[layer][:, start:end] = v
        if layer == len(self.k) - 1:
            self.length = end
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


def ragged_attention(
    q: Tensor, k: Tensor, v: Tensor, caches: list[SeqKVCache], layer: int, seq_lens: list[int], masks: Masks = None
) -> Tensor:
    """q: [N, n_heads, d]; k, v: [N, n_kv, d] (all sequences' new tokens) go in the caches; returns [N, n_heads, d].
    masks[i] [t_i, t_i] (True: may attend), when given, replaces the causal mask among sequence i's new tokens (a draft
    tree); they all see the whole cache before them."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    group, d = n_heads // n_kv, q.shape[2]
    out, start = torch.empty_like(q), 0
    for i, (cache, t) in enumerate(zip(caches, seq_lens)):
        end, past = start + t, cache.length
        keys, values = cache.append(layer, k[start:end].transpose(0, 1), v[start:end].transpose(0, 1))
        # grouped-query attention without copying K/V: the `group` query heads sharing one KV head are folded into the
        # query-length dim, [n_kv, group * t, d] (head h uses KV head h // group)
        qs = q[start:end].transpose(0, 1).reshape(n_kv, group * t, d)
        mask, causal = None, t > 1 and past == 0 and group == 1 and (masks is None or masks[i] is None)
        if masks is not None and masks[i] is not None:
            mask = torch.cat([torch.ones(t, past, dtype=torch.bool, device=q.device), masks[i]], 1).repeat(group, 1)
        elif t > 1 and not causal:  # query j (absolute past + j) sees keys 0..past + j
            mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(diagonal=past).repeat(group, 1)
        # 4-D inputs: with 3-D ones and a mask, SDPA falls back to its math path (7x slower for a prefill)
        o = sdpa(
            qs[None], keys[None], values[None], is_causal=causal, attn_mask=None if mask is None else mask[None, None]
        )
        out[start:end] = o.reshape(n_heads, t, d).transpose(0, 1)
        start = end
    return out
