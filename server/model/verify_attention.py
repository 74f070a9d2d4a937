"""Batched attention for verify passes: every sequence feeds a few tokens (a draft chain or tree), all sequences in one
kernel call per layer instead of `ragged_attention`'s Python loop over sequences.

The plan is built once per forward (`verify_plan`): queries are padded to [B, T] (T = the most new tokens of a
sequence), keys to [B, L_max] (each cache plus its new tokens), and one boolean mask [B, 1, group * T, L_max] says what
each query sees: the whole cache before it, then among the new tokens the causal order or the sequence's tree mask.
Padded query rows see key 0 only (finite, dropped). When every cache lives in the slot pool in slots base..base+B-1
(`server/model/kv_pool.py` keeps them compact), the new K/V are written in place with one indexed write per layer and
the keys are a view of the pool: no per-sequence append and no padded copy of every cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gleanrl.server.model.kv import Masks, SeqKVCache, append_padded
from gleanrl.server.model.kv_pool import KVPool, contiguous_base, pooled

MAX_VERIFY_TOKENS = 40  # a batch whose sequences all feed at most this many tokens takes the batched path


@dataclass(frozen=True, slots=True)
class VerifyPlan:
    rows: Tensor  # [N] batch row of each new token (slot - base on the pooled path)
    cols: Tensor  # [N] its index among its sequence's new tokens
    mask: Tensor  # [B, 1, group * T, L_max], rows as `rows`
    t_max: int
    pool: KVPool | None = None  # every cache in this pool, slots base..base+B-1: write in place, attend over a view
    base: int = 0
    slots: Tensor | None = None  # [N] the slot of each new token (pooled path)
    positions: Tensor | None = None  # [N] its position there


def verify_plan(
    caches: list[SeqKVCache], seq_lens: list[int], masks: Masks, group: int, device: torch.device
) -> VerifyPlan | None:
    if len(caches) < 2 or max(seq_lens) > MAX_VERIFY_TOKENS or max(seq_lens) < 2:
        return None
    t_max, pasts = max(seq_lens), [c.length for c in caches]
    l_max = max(p + t for p, t in zip(pasts, seq_lens))
    pool = pooled(caches, seq_lens)
    base = contiguous_base([c.slot for c in caches]) if pool is not None else None
    pool = pool if base is not None else None
    order = [c.slot - base for c in caches] if pool is not None else list(range(len(caches)))
    mask = torch.zeros(len(caches), t_max, l_max, dtype=torch.bool, device=device)
    for r, past, t, own in zip(order, pasts, seq_lens, masks or [None] * len(caches)):
        mask[r, :t, :past] = True
        own = own if own is not None else torch.ones(t, t, dtype=torch.bool, device=device).tril()
        mask[r, :t, past : past + t] = own
        mask[r, t:, 0] = True
    lens = torch.tensor(seq_lens)
    rows = torch.repeat_interleave(torch.tensor(order), lens).to(device)
    cols = torch.cat([torch.arange(t) for t in seq_lens]).to(device)
    plan = VerifyPlan(rows, cols, mask.repeat(1, group, 1)[:, None], t_max)
    if pool is None:
        return plan
    slots = torch.repeat_interleave(torch.tensor([c.slot for c in caches]), lens).to(device)
    positions = (torch.repeat_interleave(torch.tensor(pasts), lens) + cols.cpu()).to(device)
    return VerifyPlan(rows, cols, plan.mask, t_max, pool, base, slots, positions)


def verify_attention(
    q: Tensor, k: Tensor, v: Tensor, caches: list[SeqKVCache], layer: int, seq_lens: list[int], plan: VerifyPlan
) -> Tensor:
    """q: [N, n_heads, d]; k, v: [N, n_kv, d]. Appends k, v to the caches (on the pooled path the
    caller advances their lengths after the last layer); returns [N, n_heads, d]."""
    n_heads, n_kv, d = q.shape[1], k.shape[1], q.shape[2]
    b, l_max = len(caches), plan.mask.shape[-1]
    if plan.pool is not None:
        kbuf, vbuf = plan.pool.k[layer], plan.pool.v[layer]
        kbuf[plan.slots, :, plan.positions] = k
        vbuf[plan.slots, :, plan.positions] = v
        kp = kbuf[plan.base : plan.base + b, :, :l_max]  # [B, n_kv, L_max, d], a view
        vp = vbuf[plan.base : plan.base + b, :, :l_max]
    else:
        kp, vp = append_padded(caches, layer, k, v, seq_lens)  # [B, n_kv, L_max, d]
    qp = q.new_zeros(b, plan.t_max, n_heads, d)
    qp[plan.rows, plan.cols] = q  # [B, T, nh, d]
    # head h uses KV head h // group: [B, n_kv, group * T, d], matching the mask's row order
    qg = qp.permute(0, 2, 1, 3).reshape(b, n_kv, (n_heads // n_kv) * plan.t_max, d)
    o = F.scaled_dot_product_attention(qg, kp, vp, attn_mask=plan.mask[:, :, :, : kp.shape[2]])
    o = o.reshape(b, n_heads, plan.t_max, d).permute(0, 2, 1, 3)  # [B, T, nh, d]
    return o[plan.rows, plan.cols]
