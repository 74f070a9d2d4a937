"""Per sequence: the drafter's own KV cache and the target hidden states it has not consumed yet.

Invariant (kept by `server/sd/decoder.py`): the target cache ends one token short of the sequence's
prefix, and the state holds target aux hidden states for exactly the positions [next_pos,
cache.length) of the target cache (EAGLE-3 pairs h_i with token i+1 at position i).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gleanrl.server.model.kv import SeqKVCache


@dataclass(eq=False)
class DraftState:
    cache: SeqKVCache                 # the drafter's KV for positions [start, next_pos)
    start: int
    chunks: list[torch.Tensor] = field(default_factory=list)  # target aux states [*, 3*Ht] for
    pending: int = 0                  # positions [next_pos, next_pos + pending), not yet
                                      # fed to the drafter

    @property
    def next_pos(self) -> int:
        return self.start + self.cache.length

    @property
    def covered(self) -> int:
        return self.next_pos + self.pending

    def add(self, rows: torch.Tensor) -> None:
        self.chunks.append(rows)
        self.pending += rows.shape[0]

    def take(self) -> torch.Tensor:
        """All pending states [pending, 3*Ht], in order; the caller feeds them to the drafter."""
        rows = torch.cat(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks, self.pending = [], 0
        return rows
