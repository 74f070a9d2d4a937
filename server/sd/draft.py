"""Drafting for one SD iteration: the EAGLE-3 drafter proposes up to k tokens per sequence (a chain).

The first drafter forward is a ragged catch-up over the target hidden states each sequence has not fed yet (pairs (h_i,
token_{i+1}) at rope position i); its last row predicts draft token 1. Each further step feeds the drafter's own
pre-norm output with the token just drafted, one position on. Sampled requests draw drafts from q = the drafter's
distribution processed exactly like the target's (temperature, top-k, top-p, min-p), with the request's own generator;
greedy ones take the argmax."""

from __future__ import annotations

import torch

from gleanrl.server.sampling.sampler import processed_probs, sample
from gleanrl.server.sd.drafter_forward import drafter_forward


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
