"""Per sequence: the drafter's own KV cache and the target hidden states it has not consumed yet.

Invariant (kept by `decode/decoder.py`): the target cache ends one token short of the sequence's
prefix, and the state holds target aux hidden states for exactly the positions [next_pos,
cache.length) of the target cache (EAGLE-3 pairs h_i with token i+1 at position i). It also keeps
the last `keep` to 2 * `keep` states the drafter has consumed (`seen`, the positions just before
next_pos), so that a new drafter's cache is rebuilt from them (`rebased`) without a target forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gleanrl.server.model.kv import SeqKVCache


@dataclass(eq=False)
class DraftState:
    cache: SeqKVCache  # the drafter's KV for positions [start, next_pos)
    start: int
    chunks: list[torch.Tensor] = field(default_factory=list)  # target aux states [*, 3*Ht] for
    # positions [next_pos, next_pos + pending), not yet fed to the drafter
    pending: int = 0
    keep: int = 256  # consumed states kept for a drafter swap
    seen: list[torch.Tensor] = field(default_factory=list)  # consumed states [*, 3*Ht] for
    seen_rows: int = 0  # positions [next_pos - seen_rows, next_pos)
    rebuilt: bool = False  # a new drafter's cache is to be rebuilt (a swap's cost)

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
        self.seen.append(rows)
        self.seen_rows += rows.shape[0]
        if self.seen_rows > 2 * self.keep:  # trimmed now and then, not every iteration
            self.seen, self.seen_rows = [torch.cat(self.seen)[-self.keep :]], self.keep
        return rows

    def rebased(self, cache: SeqKVCache) -> DraftState:
        """The same target states for a new drafter with an empty `cache`: the kept consumed states
        and the pending ones, at most `keep` of them, all pending (the next catch-up feeds them).
        Valid only while `seen` ends at next_pos (between iterations)."""
        rows = self.seen + self.chunks
        new = DraftState(cache, self.covered, keep=self.keep, rebuilt=True)
        if rows:
            kept = torch.cat(rows)[-self.keep :]
            new.start -= kept.shape[0]
            new.add(kept)
        return new
