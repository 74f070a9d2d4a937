"""A slot pool for the running sequences' KV caches: per layer one buffer [slots, n_kv, capacity, d].

Each pooled `SeqKVCache` holds views of its slot, so everything written for `SeqKVCache` (ragged
prefill, SD verify and rollback by `truncate`) works unchanged. What the pool adds is the fast path of
a pure decode batch: all new K/V go in with one indexed write per layer and the keys are read with one
gather, instead of a Python loop over sequences. The gathered keys and values include positions past
a sequence's length (masked out); they must be finite, so a slot is zeroed on first use (stale values of
an earlier occupant are finite and harmless). A cache that outgrows its slot (SeqKVCache reallocates
on growth) silently leaves the pool; `decode_plan` notices and takes the ragged path for that batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gleanrl.server.kv import SeqKVCache

POOL_BYTES = 1 << 30  # allocated lazily by the OS; a slot is touched (zeroed) when first used


class KVPool:
    def __init__(self, num_layers: int, n_kv: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, slots: int, capacity: int):
        shape = (slots, n_kv, capacity, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.capacity, self.free = capacity, list(range(slots - 1, -1, -1))
        self.zeroed: set[int] = set()
        self.dims = (num_layers, n_kv, head_dim, dtype)

    @classmethod
    def for_runner(cls, runner, slots: int, capacity: int) -> KVPool | None:
        """A pool sized for `slots` sequences of up to `capacity` tokens, capped at POOL_BYTES."""
        per_token = 2 * runner.num_layers * runner.num_kv_heads * runner.head_dim * runner.dtype.itemsize
        capacity = min(capacity, POOL_BYTES // (slots * per_token))
        if capacity < 64:
            return None
        return cls(runner.num_layers, runner.num_kv_heads, runner.head_dim, runner.dtype, runner.device,
                   slots, capacity)

    def acquire(self) -> SeqKVCache | None:
        if not self.free:
            return None
        slot = self.free.pop()
        if slot not in self.zeroed:  # masked positions are read too (0 * NaN is NaN): no garbage allowed
            for buf in self.k + self.v:
                buf[slot].zero_()
            self.zeroed.add(slot)
        num_layers, n_kv, head_dim, dtype = self.dims
        cache = SeqKVCache(num_layers, n_kv, head_dim, dtype, self.k[0].device, capacity=1)
        cache.k = [buf[slot] for buf in self.k]
        cache.v = [buf[slot] for buf in self.v]
        cache.pool, cache.slot = self, slot
        return cache

    def release(self, cache: SeqKVCache) -> None:
        if getattr(cache, "pool", None) is self:
            cache.pool = None
            self.free.append(cache.slot)


@dataclass
class DecodePlan:
    pool: KVPool
    slots: torch.Tensor        # [B]
    positions: torch.Tensor    # [B] where each new token's K/V go
    mask: torch.Tensor | None  # [B, 1, 1, L_max] or None when all lengths are equal
    max_len: int


def decode_plan(caches: list[SeqKVCache], seq_lens: list[int]) -> DecodePlan | None:
    """The pooled fast path applies to a batch of >= 2 sequences, one new token each, all in one pool."""
    if len(caches) < 2 or len(seq_lens) != len(caches) or any(t != 1 for t in seq_lens):
        return None
    pool = getattr(caches[0], "pool", None)
    if pool is None or any(getattr(c, "pool", None) is not pool or c.k[0].shape[1] != pool.capacity
                           or c.length >= pool.capacity for c in caches):
        return None
    lens = [c.length + 1 for c in caches]
    device = pool.k[0].device
    mask = None
    if min(lens) != max(lens):
        mask = torch.arange(max(lens), device=device)[None] < torch.tensor(lens, device=device)[:, None]
        mask = mask[:, None, None, :]
    return DecodePlan(pool, torch.tensor([c.slot for c in caches], device=device),
                      torch.tensor([c.length for c in caches], device=device), mask, max(lens))


def pooled_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DecodePlan,
                            layer: int) -> torch.Tensor:
    """q: [B, n_heads, d]; k, v: [B, n_kv, d]. Writes k, v into the slots; returns [B, n_heads, d].
    The caller advances each cache's `length` once after the last layer."""
    b, n_heads, d = q.shape
    n_kv = k.shape[1]
    kbuf, vbuf = plan.pool.k[layer], plan.pool.v[layer]
    kbuf[plan.slots, :, plan.positions] = k
    vbuf[plan.slots, :, plan.positions] = v
    keys = kbuf[:, :, :plan.max_len].index_select(0, plan.slots)           # [B, n_kv, L_max, d]
    values = vbuf[:, :, :plan.max_len].index_select(0, plan.slots)
    qg = q.view(b, n_kv, n_heads // n_kv, d)      # query heads sharing a KV head: head h uses h // group
    return F.scaled_dot_product_attention(qg, keys, values, attn_mask=plan.mask).reshape(b, n_heads, d)
