"""A slot pool for the running sequences' KV caches: per layer one buffer [slots, n_kv, capacity, d].

Each pooled `SeqKVCache` holds views of its slot, so everything written for `SeqKVCache` (ragged prefill, SD verify and
rollback by `truncate`) works unchanged. What the pool adds is the fast path of a pure decode batch: all new K/V go in
with one indexed write per layer and the keys are read with one gather, instead of a Python loop over sequences. The
gathered keys and values include positions past a sequence's length (masked out); they must be finite, so a slot is
zeroed on first use (stale values of an earlier occupant are finite and harmless). A cache that outgrows its slot
(SeqKVCache reallocates on growth) silently leaves the pool; `decode_plan` notices and takes the ragged path.

The occupied slots are kept compact, 0..n-1: a new sequence takes the lowest free slot, and a released slot below the
highest occupied one takes that one's cache (a copy of its valid K/V, once per finished sequence). A decode batch of
every pooled sequence then attends over a view of the buffers' first n slots, with no gather of the keys and values at
all. The caches' views are retargeted on a move, so nothing may hold a cache's `k`/`v` lists across iterations; moves
happen between iterations (under the state's lock)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch
from torch import Tensor

from gleanrl.server.model.kv import SeqKVCache, decode_sdpa, length_mask

POOL_BYTES = 1 << 30  # allocated lazily by the OS; a slot is touched (zeroed) when first used


class KVPool:
    def __init__(self, runner, slots: int, capacity: int):
        """`slots` sequences of `capacity` tokens of `runner`'s shape (not kept: it would pin swapped-out weights)."""
        self.dims = (runner.num_layers, runner.num_kv_heads, runner.head_dim, runner.dtype)  # for SeqKVCache
        shape = (slots, runner.num_kv_heads, capacity, runner.head_dim)
        self.k = [torch.empty(shape, dtype=runner.dtype, device=runner.device) for _ in range(runner.num_layers)]
        self.v = [torch.empty(shape, dtype=runner.dtype, device=runner.device) for _ in range(runner.num_layers)]
        self.capacity, self.free = capacity, list(range(slots))  # free: a heap, the lowest slot first
        self.owner: dict[int, SeqKVCache] = {}
        self.zeroed: set[int] = set()

    @classmethod
    def for_runner(cls, runner, slots: int, capacity: int) -> KVPool | None:
        """A pool sized for `slots` sequences of up to `capacity` tokens, capped at POOL_BYTES."""
        per_token = 2 * runner.num_layers * runner.num_kv_heads * runner.head_dim * runner.dtype.itemsize
        capacity = min(capacity, POOL_BYTES // (slots * per_token))
        return cls(runner, slots, capacity) if capacity >= 64 else None

    def acquire(self) -> SeqKVCache | None:
        if not self.free:
            return None
        slot = heapq.heappop(self.free)
        if slot not in self.zeroed:
            for buf in self.k + self.v:  # masked positions are read too (0 * NaN is NaN): no garbage allowed
                buf[slot].zero_()
            self.zeroed.add(slot)
        cache = SeqKVCache(*self.dims, self.k[0].device, capacity=1)
        self._place(cache, slot)
        return cache

    def _place(self, cache: SeqKVCache, slot: int) -> None:
        cache.k = [buf[slot] for buf in self.k]
        cache.v = [buf[slot] for buf in self.v]
        cache.pool, cache.slot = self, slot
        self.owner[slot] = cache

    def release(self, cache: SeqKVCache) -> None:
        if cache.pool is not self:
            return
        cache.pool, slot = None, cache.slot
        del self.owner[slot]
        top = max(self.owner, default=-1)
        if top > slot:  # keep the occupied slots compact: the highest one moves down into the hole
            moved = self.owner.pop(top)
            if moved.k[0].shape[1] != self.capacity:  # it grew out of its slot: both slots are free
                moved.pool = None
                heapq.heappush(self.free, slot)
            else:
                for buf in self.k + self.v:
                    buf[slot, :, : moved.length] = buf[top, :, : moved.length]
                self._place(moved, slot)
            slot = top
        heapq.heappush(self.free, slot)


@dataclass
class DecodePlan:
    pool: KVPool
    slots: Tensor  # [B]
    positions: Tensor  # [B] where each new token's K/V go
    mask: Tensor | None  # [B, 1, 1, L_max] (in slot order when `base` is set) or None: lengths equal
    max_len: int
    base: int | None  # the slots are base..base+B-1: attend over a view of the buffers, no gather
    order: Tensor | None  # [B] the batch row of slot base + j (None: the batch is in slot order)
    back: Tensor | None  # [B] the slot-order position of batch row i


def pooled(caches: list[SeqKVCache], seq_lens: list[int]) -> KVPool | None:
    """The pool all of `caches` live in, with room for their `seq_lens` new tokens; None if any is not."""
    pool = caches[0].pool if caches else None
    if pool is None or any(
        c.pool is not pool or c.k[0].shape[1] != pool.capacity or c.length + t > pool.capacity
        for c, t in zip(caches, seq_lens)
    ):
        return None
    return pool


def contiguous_base(slots: list[int]) -> int | None:
    """The first slot if the (distinct) slots are base..base+B-1: the batch attends over a view."""
    return min(slots) if max(slots) - min(slots) == len(slots) - 1 else None


def decode_plan(caches: list[SeqKVCache], seq_lens: list[int]) -> DecodePlan | None:
    """The pooled fast path applies to a batch of sequences with one new token each, all in one pool."""
    pool = pooled(caches, seq_lens) if len(seq_lens) == len(caches) and all(t == 1 for t in seq_lens) else None
    if pool is None:
        return None
    slots = [c.slot for c in caches]
    lens = [c.length + 1 for c in caches]
    device = pool.k[0].device
    base = contiguous_base(slots)
    order = back = None
    if base is not None and slots != list(range(base, base + len(slots))):
        row_of = sorted(range(len(slots)), key=slots.__getitem__)
        lens = [lens[i] for i in row_of]
        order = torch.tensor(row_of, device=device)
        back = torch.tensor([s - base for s in slots], device=device)
    positions = torch.tensor([c.length for c in caches], device=device)
    return DecodePlan(
        pool, torch.tensor(slots, device=device), positions, length_mask(lens, device), max(lens), base, order, back
    )


def pooled_decode_attention(q: Tensor, k: Tensor, v: Tensor, plan: DecodePlan, layer: int) -> Tensor:
    """q: [B, n_heads, d]; k, v: [B, n_kv, d]. Writes k, v into the slots; returns [B, n_heads, d].
    The caller advances each cache's `length` once after the last layer."""
    b = q.shape[0]
    kbuf, vbuf = plan.pool.k[layer], plan.pool.v[layer]
    kbuf[plan.slots, :, plan.positions] = k
    vbuf[plan.slots, :, plan.positions] = v
    if plan.base is not None:  # a view of the slots base..base+B-1, queries in slot order
        keys = kbuf[plan.base : plan.base + b, :, : plan.max_len]  # [B, n_kv, L_max, d]
        values = vbuf[plan.base : plan.base + b, :, : plan.max_len]
        q = q if plan.order is None else q.index_select(0, plan.order)
    else:
        keys = kbuf[:, :, : plan.max_len].index_select(0, plan.slots)
        values = vbuf[:, :, : plan.max_len].index_select(0, plan.slots)
    o = decode_sdpa(q, keys, values, plan.mask)
    return o if plan.back is None else o.index_select(0, plan.back)
