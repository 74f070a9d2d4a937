"""The model's one attention interface: `plan_attention` once per forward picks the kernel, `attention` runs it for one
layer, `advance_caches` after the last layer; the runner names no kernel.

Kernels: the slot pool's decode batch (`kv_pool.pooled_decode_attention`, K/V written in place), verify passes of a few
tokens per sequence (`verify_attention`), a padded decode batch for caches outside the pool (`decode_attention`, below),
and anything else, one sequence at a time (`kv.ragged_attention`: prefill chunks, mixed batches, trees of one sequence).
`ragged_attention`'s Python loop over sequences dominates a decode step of a small model at large batch, hence the
padded kernel: the new K/V appended to each cache, then the caches padded into one [B, L_max] batch (a copy, done in
C++) and attended with a length mask."""

from __future__ import annotations

import torch
from torch import Tensor

from gleanrl.server.model.kv import Masks, SeqKVCache, append_padded, decode_sdpa, length_mask, ragged_attention
from gleanrl.server.model.kv_pool import DecodePlan, decode_plan, pooled_decode_attention
from gleanrl.server.model.verify_attention import VerifyPlan, verify_attention, verify_plan

Plan = DecodePlan | VerifyPlan | None


def plan_attention(
    caches: list[SeqKVCache], seq_lens: list[int], tree_masks: Masks, group: int, device: torch.device
) -> Plan:
    """Once per forward: the pooled decode plan (one token each, no trees), else a verify plan where
    one applies, else None (padded decode or ragged attention, decided per call)."""
    plan = decode_plan(caches, seq_lens) if tree_masks is None else None
    return plan if plan is not None else verify_plan(caches, seq_lens, tree_masks, group, device)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    caches: list[SeqKVCache],
    layer: int,
    seq_lens: list[int],
    plan: Plan,
    tree_masks: Masks = None,
) -> Tensor:
    """q: [N, n_heads, d]; k, v: [N, n_kv, d] (all sequences' new tokens) go in the caches; returns [N, n_heads, d]."""
    if isinstance(plan, DecodePlan):  # a pure decode batch in the slot pool
        return pooled_decode_attention(q, k, v, plan, layer)
    if plan is not None:  # a verify pass: a few tokens per sequence, one kernel for all
        return verify_attention(q, k, v, caches, layer, seq_lens, plan)
    if q.shape[0] == len(caches) > 1 and tree_masks is None:  # a pure decode batch outside the pool
        return decode_attention(q, k, v, caches, layer)
    return ragged_attention(q, k, v, caches, layer, seq_lens, tree_masks)


def advance_caches(plan: Plan, caches: list[SeqKVCache], seq_lens: list[int]) -> None:
    """After the last layer: the pooled kernels wrote K/V in place; their caches advance once here."""
    if isinstance(plan, DecodePlan) or (isinstance(plan, VerifyPlan) and plan.pool is not None):
        for c, t in zip(caches, seq_lens):
            c.length += t


def decode_attention(q: Tensor, k: Tensor, v: Tensor, caches: list[SeqKVCache], layer: int) -> Tensor:
    """q: [B, n_heads, d]; k, v: [B, n_kv, d] (token i: caches[i]'s) go in the caches; returns [B, n_heads, d]."""
    mask = length_mask([c.length + 1 for c in caches], q.device)  # before the append
    return decode_sdpa(q, *append_padded(caches, layer, k, v, [1] * len(caches)), mask)
