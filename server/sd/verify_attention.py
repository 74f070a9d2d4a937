"""Batched attention for verify passes: every sequence feeds a few tokens (a draft chain or tree), all
sequences in one kernel call per layer instead of `ragged_attention`'s Python loop over sequences.

The plan is built once per forward (`verify_plan`): queries are padded to [B, T] (T = the most new tokens
of a sequence), keys to [B, L_max] (each cache plus its new tokens), and one boolean mask
[B, 1, group * T, L_max] says what each query sees: the whole cache before it, then among the new
tokens the causal order or the sequence's tree mask. Padded query rows see key 0 only (finite, dropped).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from gleanrl.server.kv import SeqKVCache

MAX_VERIFY_TOKENS = 40  # a batch whose sequences all feed at most this many tokens takes the batched path


@dataclass(frozen=True, slots=True)
class VerifyPlan:
    rows: torch.Tensor          # [N] batch index of each new token
    cols: torch.Tensor          # [N] its index among its sequence's new tokens
    mask: torch.Tensor          # [B, 1, group * T, L_max]
    t_max: int


def verify_plan(caches: list[SeqKVCache], seq_lens: list[int], masks: list[torch.Tensor | None] | None,
                group: int, device: torch.device) -> VerifyPlan | None:
    if len(caches) < 2 or max(seq_lens) > MAX_VERIFY_TOKENS or max(seq_lens) < 2:
        return None
    t_max, pasts = max(seq_lens), [c.length for c in caches]
    l_max = max(p + t for p, t in zip(pasts, seq_lens))
    mask = torch.zeros(len(caches), t_max, l_max, dtype=torch.bool, device=device)
    for b, (past, t) in enumerate(zip(pasts, seq_lens)):
        own = masks[b] if masks is not None and masks[b] is not None else \
            torch.ones(t, t, dtype=torch.bool, device=device).tril()
        mask[b, :t, :past] = True
        mask[b, :t, past:past + t] = own
        mask[b, t:, 0] = True
    rows = torch.repeat_interleave(torch.arange(len(caches)), torch.tensor(seq_lens)).to(device)
    cols = torch.cat([torch.arange(t) for t in seq_lens]).to(device)
    return VerifyPlan(rows, cols, mask.repeat(1, group, 1)[:, None], t_max)


def verify_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, caches: list[SeqKVCache], layer: int,
                     seq_lens: list[int], plan: VerifyPlan) -> torch.Tensor:
    """q: [N, n_heads, d]; k, v: [N, n_kv, d]. Appends k, v to the caches; returns [N, n_heads, d]."""
    n_heads, n_kv, d = q.shape[1], k.shape[1], q.shape[2]
    keys, values, start = [], [], 0
    for cache, t in zip(caches, seq_lens):
        ks, vs = cache.append(layer, k[start:start + t].transpose(0, 1), v[start:start + t].transpose(0, 1))
        keys.append(ks.transpose(0, 1))                                      # [L_i, n_kv, d]
        values.append(vs.transpose(0, 1))
        start += t
    kp = pad_sequence(keys, batch_first=True).transpose(1, 2)                # [B, n_kv, L_max, d]
    vp = pad_sequence(values, batch_first=True).transpose(1, 2)
    b = len(caches)
    qp = q.new_zeros(b, plan.t_max, n_heads, d)
    qp[plan.rows, plan.cols] = q                                             # [B, T, nh, d]
    # head h uses KV head h // group: [B, n_kv, group * T, d], matching the mask's row order
    qg = qp.permute(0, 2, 1, 3).reshape(b, n_kv, (n_heads // n_kv) * plan.t_max, d)
    o = F.scaled_dot_product_attention(qg, kp, vp, attn_mask=plan.mask[:, :, :, :kp.shape[2]])
    o = o.reshape(b, n_heads, plan.t_max, d).permute(0, 2, 1, 3)             # [B, T, nh, d]
    return o[plan.rows, plan.cols]
