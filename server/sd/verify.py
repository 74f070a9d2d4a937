"""Speculative decoding math: verify k drafted tokens per sequence against the target's k+1
distributions (Leviathan et al. 2023; Chen et al. 2023), as pure tensor functions.

Rule (sampling): draft token x_i ~ q_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection the next token is drawn from normalize(max(p_i - q_i, 0)); if all k are accepted a bonus
token is drawn from p_{k+1}. Every emitted token is then distributed exactly as the target's p, whatever
q is, provided the drafts really were sampled from q. p and q are the *processed* distributions
(temperature, top-p, top-k, min-p applied by the engine's sampler to both). Greedy (temperature 0):
accept while the draft equals the target's argmax; the emitted tokens are the target's argmax tokens.

Ragged batches: rows draft k_b <= K tokens (`draft_lens`); ids and distributions are padded to K, the
padding is never accepted, and a row whose k_b drafts are all accepted draws its bonus from p_{k_b+1}.
Each row draws exactly k_b uniforms from its own generator, whatever else is in the batch.
"""
from __future__ import annotations

import torch


def sample_rows(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """probs: [B, V] (rows sum to 1) -> ids [B], row b drawn with generators[b]."""
    rows = probs.float().cpu()  # the generators are CPU generators
    return torch.cat([torch.multinomial(rows[b], 1, generator=g) for b, g in enumerate(generators)]).to(probs.device)


def _valid(draft_ids: torch.Tensor, draft_lens: torch.Tensor | None) -> torch.Tensor:
    """[B, K] mask of real (not padded) draft positions."""
    k = draft_ids.shape[1]
    if draft_lens is None:
        return torch.ones_like(draft_ids, dtype=torch.bool)
    return torch.arange(k, device=draft_ids.device)[None] < draft_lens.to(draft_ids.device)[:, None]


def verify_greedy(draft_ids: torch.Tensor, target_ids: torch.Tensor,
                  draft_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_ids: [B, K]; target_ids: [B, K+1] (the target's argmax at each of the K+1 positions).
    Returns (n_accepted [B] in 0..k_b, out_ids [B, K+1]); emit out_ids[b, :n_accepted[b] + 1]."""
    match = (draft_ids == target_ids[:, :-1]) & _valid(draft_ids, draft_lens)    # [B, K]
    n_accepted = match.to(torch.int64).cumprod(dim=1).sum(dim=1)                 # leading run of matches
    return n_accepted, target_ids


def verify_sampled(draft_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   generators: list[torch.Generator | None],
                   draft_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_ids: [B, K] sampled from draft_probs [B, K, V]; target_probs: [B, K+1, V].
    Returns (n_accepted [B] in 0..k_b, out_ids [B, K+1]); emit out_ids[b, :n_accepted[b] + 1]."""
    bsz, k = draft_ids.shape
    valid = _valid(draft_ids, draft_lens)                                    # [B, K]
    lens = valid.sum(dim=1).tolist()
    idx = draft_ids.unsqueeze(-1)                                            # [B, K, 1]
    p_x = target_probs[:, :k].gather(-1, idx).squeeze(-1).float()            # [B, K]
    q_x = draft_probs.gather(-1, idx).squeeze(-1).float()                    # [B, K]
    u = torch.ones(bsz, k)
    for b, (g, n) in enumerate(zip(generators, lens)):
        u[b, :n] = torch.rand(n, generator=g)
    accept = (u.to(p_x.device) * q_x < p_x) & valid                          # u < p/q, no division by q = 0
    n_accepted = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)            # [B]
    # position n_accepted: residual max(p - q, 0) after a rejection, plain p for the bonus (q := 0 there)
    q_pad = torch.cat([draft_probs * valid[..., None], draft_probs.new_zeros(bsz, 1, draft_probs.shape[-1])], dim=1)
    rows = torch.arange(bsz, device=draft_ids.device)
    p_n, q_n = target_probs[rows, n_accepted], q_pad[rows, n_accepted]      # [B, V]
    residual = (p_n - q_n).clamp_min(0)
    mass = residual.sum(dim=-1, keepdim=True)
    # mass == 0 only when p == q at that position, where a rejection has probability 0 (rounding hazard)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)
    out_ids = torch.cat([draft_ids, draft_ids.new_zeros(bsz, 1)], dim=1)     # [B, K+1]
    out_ids[rows, n_accepted] = sample_rows(residual, generators)
    return n_accepted, out_ids


def verify(draft_ids: torch.Tensor, target_ids: torch.Tensor, greedy: list[bool],
           draft_lens: torch.Tensor | None = None, draft_probs: torch.Tensor | None = None,
           target_probs: torch.Tensor | None = None,
           generators: list[torch.Generator | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixed batch in one call: rows with greedy[b] use verify_greedy (target_ids [B, K+1]); the S
    others verify_sampled, with draft_probs [S, K, V], target_probs [S, K+1, V] and their generators
    given for those rows only, in batch order. Same returns."""
    n_accepted, out_ids = verify_greedy(draft_ids, target_ids, draft_lens)
    sampled = [b for b, g in enumerate(greedy) if not g]
    if sampled:
        if draft_probs is None or target_probs is None or generators is None:
            raise ValueError("sampled rows need draft_probs, target_probs and generators")
        rows = torch.tensor(sampled, device=draft_ids.device)
        n_s, out_s = verify_sampled(draft_ids[rows], draft_probs, target_probs, generators,
                                    None if draft_lens is None else draft_lens[rows.to(draft_lens.device)])
        n_accepted, out_ids = n_accepted.clone(), out_ids.clone()
        n_accepted[rows], out_ids[rows] = n_s, out_s
    return n_accepted, out_ids
