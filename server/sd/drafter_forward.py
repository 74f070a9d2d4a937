"""The EAGLE-3 drafter's serving forward: the harvest drafter's math over per-sequence KV caches.

The drafter model (`gleanrl.harvest.drafter`) holds the weights and the per-token math (`project`, `qkv`, `finish`);
training attends over whole windows, serving attends over a ragged batch with a cache per sequence, which is the
server's own KV machinery (`gleanrl.server.model.kv`; a drafter step of one token per sequence attends in one padded
kernel, `model.attention.decode_attention`)."""

from __future__ import annotations

import torch

from gleanrl.harvest.drafter import Eagle3Drafter
from gleanrl.server.model.attention import decode_attention
from gleanrl.server.model.kv import SeqKVCache, ragged_attention


def new_draft_cache(drafter: Eagle3Drafter, capacity: int = 64) -> SeqKVCache:
    c, p = drafter.config, drafter.fc.weight
    return SeqKVCache(1, c.num_key_value_heads, c.head_dim, p.dtype, p.device, capacity)


def drafter_forward(
    drafter: Eagle3Drafter,
    input_ids: torch.Tensor,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    caches: list[SeqKVCache],
    seq_lens: list[int],
) -> torch.Tensor:
    """Ragged batch of N tokens: input_ids [N], hidden [N, n*Ht] or [N, H], positions [N] -> pre-norm h [N, H]. Appends
    each token's K/V to its sequence's cache."""
    r = drafter.project(hidden)
    q, k, v = drafter.qkv(input_ids, r, positions)
    if len(caches) > 1 and len(seq_lens) == q.shape[0]:  # one token each: one padded kernel
        o = decode_attention(q, k, v, caches, 0)
    else:
        o = ragged_attention(q, k, v, caches, 0, seq_lens)
    return drafter.finish(o, r)
