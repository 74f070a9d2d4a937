"""Batched attention for a decode step: one new token per sequence, all sequences in one kernel call.

`server/model/kv.py`'s `ragged_attention` loops over sequences in Python, which dominates a decode step
of a small model at large batch. Here the new K/V are appended to each sequence's cache as before, then the
caches are padded into one [B, L_max] batch (a copy, done in C++) and attended with a length mask.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from gleanrl.server.model.kv import SeqKVCache


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, caches: list[SeqKVCache],
                     layer: int) -> torch.Tensor:
    """q: [B, n_heads, d]; k, v: [B, n_kv_heads, d] (token i belongs to caches[i]).
    Appends k, v to the caches and returns the attention output [B, n_heads, d]."""
    b, n_heads, d = q.shape
    n_kv = k.shape[1]
    keys, values = [], []
    for i, cache in enumerate(caches):
        ks, vs = cache.append(layer, k[i, :, None], v[i, :, None])         # [n_kv, L_i, d]
        keys.append(ks.transpose(0, 1))                                     # [L_i, n_kv, d]
        values.append(vs.transpose(0, 1))
    lens = [x.shape[0] for x in keys]
    kp = pad_sequence(keys, batch_first=True).transpose(1, 2)               # [B, n_kv, L_max, d]
    vp = pad_sequence(values, batch_first=True).transpose(1, 2)
    mask = None
    if min(lens) != max(lens):
        mask = (torch.arange(max(lens), device=q.device)[None] < torch.tensor(lens, device=q.device)[:, None])
        mask = mask[:, None, None, :]                                       # [B, 1, 1, L_max]
    qg = q.view(b, n_kv, n_heads // n_kv, d)      # query heads sharing a KV head: head h uses h // group
    return F.scaled_dot_product_attention(qg, kp, vp, attn_mask=mask).reshape(b, n_heads, d)
