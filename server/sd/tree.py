"""The draft tree of one sequence in the target pass: the root (its last committed token) and M branches.

Layout of the t = 1 + sum(len_m) new tokens: [root, branch 0 tokens, branch 1 tokens, ...]. Branch m's token j sits at
position root_pos + 1 + j and attends to the cache, the root and branch m's tokens 0..j only. After verification the
accepted path (root, then the first n tokens of one branch) is moved to the front of the new rows (`keep_path`), so the
cache again holds one contiguous sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gleanrl.server.model.kv import SeqKVCache


@dataclass(frozen=True, slots=True)
class DraftTree:
    tokens: list[int]  # [t]: root, then each branch
    positions: list[int]  # [t]
    offsets: list[int]  # offsets[m]: row of branch m's first token
    lens: list[int]  # tokens per branch

    @property
    def size(self) -> int:
        return len(self.tokens)

    def mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[t, t] bool: row i may attend to column j (j is i or one of its ancestors)."""
        m = torch.zeros(self.size, self.size, dtype=torch.bool, device=device)
        m[:, 0] = True
        for off, n in zip(self.offsets, self.lens):
            m[off : off + n, off : off + n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        return m

    def rows(self, branch: int, n: int) -> list[int]:
        """Rows of the accepted path: the root, then branch `branch`'s first n tokens (branch -1: root only)."""
        return [0] + (list(range(self.offsets[branch], self.offsets[branch] + n)) if branch >= 0 else [])

    def branch_rows(self, m: int) -> list[int]:
        """Rows whose target distribution follows branch m's tokens 0..len-1 (the root's row first)."""
        return [0] + list(range(self.offsets[m], self.offsets[m] + self.lens[m]))


def build_tree(root: int, root_pos: int, branches: list[list[int]]) -> DraftTree:
    tokens, positions, offsets = [root], [root_pos], []
    for b in branches:
        offsets.append(len(tokens))
        tokens += b
        positions += range(root_pos + 1, root_pos + 1 + len(b))
    return DraftTree(tokens, positions, offsets, [len(b) for b in branches])


@torch.inference_mode()
def keep_path(cache: SeqKVCache, start: int, rows: list[int]) -> None:
    """The tree's new K/V begin at cache position `start`; keep exactly the given rows (ascending, rows[0] == 0) as
    positions start, start + 1, ... and drop the rest."""
    if rows != list(range(len(rows))):
        src = torch.tensor(rows, device=cache.k[0].device) + start
        for buf in (cache.k, cache.v):
            for layer in buf:  # [n_kv, capacity, d]
                layer[:, start : start + len(rows)] = layer[:, src]
    cache.truncate(start + len(rows))
