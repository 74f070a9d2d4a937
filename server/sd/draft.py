"""Drafting for one SD iteration: the EAGLE-3 drafter proposes up to k tokens per sequence (a chain).

The first drafter forward is a ragged catch-up over the target hidden states each sequence has not fed yet (pairs (h_i,
token_{i+1}) at rope position i); its last row predicts draft token 1. Each further step feeds the drafter's own
pre-norm output with the token just drafted, one position on. Sampled requests draw drafts from q = the drafter's
distribution processed exactly like the target's (temperature, top-k, top-p, min-p), with the request's own generator;
greedy ones take the argmax.

Per sequence a `DraftState`: the drafter's own KV cache and the target hidden states it has not consumed yet. Invariant
(kept by `decode/sd_decoder.py`, with `sync_states`): the target cache ends one token short of the sequence's prefix,
and the state holds target aux hidden states for exactly the positions [next_pos, cache.length) of the target cache
(EAGLE-3 pairs h_i with token i+1 at position i). It also keeps the last `keep` to 2 * `keep` states the drafter has
consumed (`seen`, the positions just before next_pos), so that a new drafter's cache is rebuilt from them (`rebased`)
without a target forward."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gleanrl.harvest.drafter import Eagle3Drafter
from gleanrl.server.model.kv import SeqKVCache
from gleanrl.server.sampling.sampler import processed_probs, sample
from gleanrl.server.sampling.sequence import Sequence
from gleanrl.server.sd.drafter_forward import drafter_forward, new_draft_cache


@dataclass(eq=False)
class DraftState:
    cache: SeqKVCache  # the drafter's KV for positions [start, next_pos)
    start: int
    chunks: list[torch.Tensor] = field(default_factory=list)  # target aux states [*, 3*Ht] not yet fed to the drafter
    pending: int = 0  # their rows: positions [next_pos, next_pos + pending)
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
        """The same target states for a new drafter with an empty `cache`: the kept consumed states and the pending
        ones, at most `keep` of them, all pending (the next catch-up feeds them). Valid only while `seen` ends at
        next_pos (between iterations)."""
        rows = self.seen + self.chunks
        new = DraftState(cache, self.covered, keep=self.keep, rebuilt=True)
        if rows:
            kept = torch.cat(rows)[-self.keep :]
            new.start -= kept.shape[0]
            new.add(kept)
        return new


def sync_states(
    states: dict[Sequence, DraftState], seqs: list[Sequence], drafter: Eagle3Drafter, window: int
) -> dict[Sequence, DraftState]:
    """The states of `seqs`, each keeping the invariant: a broken one (or none) restarts `window` tokens back, where the
    target cache is truncated to re-feed them; a long stretch without SD keeps a window."""
    kept = {}
    for s in seqs:
        st, length = states.get(s), s.cache.length
        if st is None or st.covered != length:
            s.cache.truncate(max(length - window, 0))
            st = DraftState(new_draft_cache(drafter), s.cache.length, keep=window)
        elif st.pending > window + 64:
            old, st = st, DraftState(new_draft_cache(drafter), st.covered - window, keep=window)
            st.add(old.take()[-window:])
        kept[s] = st
    return kept


def same_inputs(a: Eagle3Drafter, b: Eagle3Drafter) -> bool:
    """Two drafters read the same target hidden states (a swap keeps the states, `rebased`)."""
    return (
        list(a.config.aux_layer_ids) == list(b.config.aux_layer_ids)
        and a.fc.weight.shape[1] == b.fc.weight.shape[1]
        and a.fc.weight.dtype == b.fc.weight.dtype
    )


def _draw(
    logits: torch.Tensor, prm: dict[str, torch.Tensor], generators: list
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [A, V] -> (tokens [A], q [A, V] or None when every row is greedy)."""
    if bool((prm["temperature"] <= 0).all()):
        return logits.argmax(-1), None
    q = processed_probs(logits, prm["temperature"], prm["top_k"], prm["top_p"], prm["min_p"])
    return sample(q, generators).to(logits.device), q


@torch.inference_mode()
def draft_tokens(
    drafter, seqs: list, states: list, ks: list[int], prm: dict[str, torch.Tensor]
) -> tuple[list[list[int]], list[torch.Tensor | None]]:
    """Returns per sequence the k_b drafted ids and their draft distributions q [k_b, V] (None if greedy). Consumes
    every state's pending hidden states; the drafter caches grow by up to k_b - 1 own entries."""
    ids, pos, lens = [], [], []
    for s, st in zip(seqs, states):
        n, p0 = st.pending, st.next_pos
        ids += s.tokens(p0 + 1, p0 + 1 + n)
        pos += range(p0, p0 + n)
        lens.append(n)
    hidden = torch.cat([st.take() for st in states])  # [N, 3*Ht]
    device = hidden.device
    ids_t, pos_t = torch.tensor(ids, device=device), torch.tensor(pos, device=device)
    h = drafter_forward(drafter, ids_t, hidden, pos_t, [st.cache for st in states], lens)  # [N, H]
    g = h[torch.tensor(lens, device=device).cumsum(0) - 1]  # [B, H]
    drafts: list[list[int]] = [[] for _ in seqs]
    qs: list[list[torch.Tensor]] = [[] for _ in seqs]
    rows = list(range(len(seqs)))
    for step in range(max(ks)):
        every = len(rows) == len(seqs) and all(k > step for k in ks)  # no indexing (batch 1: always)
        rows = rows if every else [b for b in rows if ks[b] > step]
        tok, q = _draw(
            drafter.logits(g if every else g[rows]),
            prm if every else {k: v[rows] for k, v in prm.items()},
            [seqs[b].generator for b in rows],
        )
        for j, (b, t) in enumerate(zip(rows, tok.tolist())):
            drafts[b].append(t)
            if q is not None:
                qs[b].append(q[j])
        nxt = [j for j, b in enumerate(rows) if ks[b] > step + 1]
        if not nxt:
            break
        bs = [rows[j] for j in nxt]
        pos = torch.tensor([states[b].next_pos for b in bs], device=device)
        if len(bs) == len(seqs):  # then every row drafted this step: tok and g are all rows
            g = drafter_forward(drafter, tok, g, pos, [st.cache for st in states], [1] * len(bs))
        else:
            g[bs] = drafter_forward(drafter, tok[nxt], g[bs], pos, [states[b].cache for b in bs], [1] * len(bs))
    return drafts, [torch.stack(q) if q else None for q in qs]
