"""The model's one attention interface: `plan_attention` once per forward picks the kernel,
`attention` runs it for one layer, `advance_caches` after the last layer; the runner
names no kernel.

Kernels: the slot pool's decode batch (`kv_pool.pooled_decode_attention`, K/V written in place),
verify passes of a few tokens per sequence (`verify_attention`), a padded decode batch for caches
outside the pool (`decode_attention`, below), and anything else, one sequence at a time
(`kv.ragged_attention`: prefill chunks, mixed batches, trees of one sequence).

Padded decode attention: one new token per sequence, all sequences in one kernel call.

`server/model/kv.py`'s `ragged_attention` loops over sequences in Python, which dominates a decode
step of a small model at large batch. Here the new K/V are appended to each sequence's cache as
before, then the caches are padded into one [B, L_max] batch (a copy, done in C++) and attended
with a length mask.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from gleanrl.server.model.kv import SeqKVCache, ragged_attention, sdpa
from gleanrl.server.model.kv_pool import DecodePlan, decode_plan, pooled_decode_attention
from gleanrl.server.model.verify_attention import VerifyPlan, verify_attention, verify_plan

Plan = DecodePlan | VerifyPlan | None


def plan_attention(
    caches: list[SeqKVCache],
    seq_lens: list[int],
    tree_masks: list[torch.Tensor | None] | None,
    group: int,
    device: torch.device,
) -> Plan:
    """Once per forward: the pooled decode plan (one token each, no trees), else a verify plan where
    one applies, else None (padded decode or ragged attention, decided per call)."""
    plan = decode_plan(caches, seq_lens) if tree_masks is None else None
    return plan if plan is not None else verify_plan(caches, seq_lens, tree_masks, group, device)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    caches: list[SeqKVCache],
    layer: int,
    seq_lens: list[int],
    plan: Plan,
    tree_masks: list[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """q: [N, n_heads, d]; k, v: [N, n_kv, d] for the N new tokens of all sequences. Stores k, v in
    the caches and returns [N, n_heads, d]."""
    if isinstance(plan, DecodePlan):  # a pure decode batch in the slot pool
        return pooled_decode_attention(q, k, v, plan, layer)
    if plan is not None:  # a verify pass: a few tokens per sequence, one kernel for all
        return verify_attention(q, k, v, caches, layer, seq_lens, plan)
    if q.shape[0] == len(caches) > 1 and tree_masks is None:  # a pure decode batch outside the pool
        return decode_attention(q, k, v, caches, layer)
    return ragged_attention(q, k, v, caches, layer, seq_lens, tree_masks)


def advance_caches(plan: Plan, caches: list[SeqKVCache], seq_lens: list[int]) -> None:
    """After the last layer: the pooled kernels wrote K/V in place; their caches
    advance once here."""
    if isinstance(plan, DecodePlan) or (isinstance(plan, VerifyPlan) and plan.pool is not None):
        for c, t in zip(caches, seq_lens):
            c.length += t


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, caches: list[SeqKVCache], layer: int
) -> torch.Tensor:
    """q: [B, n_heads, d]; k, v: [B, n_kv_heads, d] (token i belongs to caches[i]).
    Appends k, v to the caches and returns the attention output [B, n_heads, d]."""
    b, n_heads, d = q.shape
    n_kv = k.shape[1]
    keys, values = [], []
    for i, cache in enumerate(caches):
        ks, vs = cache.append(layer, k[i, :, None], v[i, :, None])  # [n_kv, L_i, d]
        keys.append(ks.transpose(0, 1))  # [L_i, n_kv, d]
        values.append(vs.transpose(0, 1))
    lens = [x.shape[0] for x in keys]
    kp = pad_sequence(keys, batch_first=True).transpose(1, 2)  # [B, n_kv, L_max, d]
    vp = pad_sequence(values, batch_first=True).transpose(1, 2)
    mask = None
    if min(lens) != max(lens):
        mask = torch.arange(max(lens), device=q.device)[None] < torch.tensor(lens, device=q.device)[:, None]
        mask = mask[:, None, None, :]  # [B, 1, 1, L_max]
    # query heads sharing a KV head: head h uses h // group
    qg = q.view(b, n_kv, n_heads // n_kv, d)
    return sdpa(qg, kp, vp, attn_mask=mask).reshape(b, n_heads, d)
