"""Speculative decoding math: verify k drafted tokens per sequence against the target's k+1
distributions (Leviathan et al. 2023; Chen et al. 2023), as pure tensor functions.

Rule (sampling): draft token x_i ~ q_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection the next token is drawn from normalize(max(p_i - q_i, 0)); if all k are accepted a bonus
token is drawn from p_{k+1}. Every emitted token is then distributed exactly as the target's p, whatever
q is, provided the drafts really were sampled from q. p and q are the *processed* distributions
(temperature, top-p, top-k, min-p applied by the engine's sampler to both). Greedy (temperature 0):
accept while the draft equals the target's argmax; the emitted tokens are the target's argmax tokens.

Simplified relative to TLT / SGLang EAGLE-3: drafts are a single chain (top-1 per step, no token tree,
no tree attention), so one verify pass scores k+1 positions per sequence. A tree raises acceptance per
pass but needs tree masks and multi-path cache bookkeeping; on CPU with tiny batches the chain already
captures most of the gain and keeps the losslessness argument to the textbook one above. Sampled outputs
are distributed exactly as without SD but are not the same samples for the same seed (SD consumes the
per-request generator differently).
"""
from __future__ import annotations

import torch


def sample_rows(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """probs: [B, V] (rows sum to 1) -> ids [B], row b drawn with generators[b]."""
    rows = probs.float().cpu()  # the generators are CPU generators
    return torch.cat([torch.multinomial(rows[b], 1, generator=g) for b, g in enumerate(generators)]).to(probs.device)


def verify_greedy(draft_ids: torch.Tensor, target_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_ids: [B, k]; target_ids: [B, k+1] (the target's argmax at each of the k+1 positions).
    Returns (n_accepted [B] in 0..k, out_ids [B, k+1]); emit out_ids[b, :n_accepted[b] + 1]."""
    match = draft_ids == target_ids[:, :-1]                                  # [B, k]
    n_accepted = match.to(torch.int64).cumprod(dim=1).sum(dim=1)             # leading run of matches
    return n_accepted, target_ids


def verify_sampled(draft_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   generators: list[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_ids: [B, k] sampled from draft_probs [B, k, V]; target_probs: [B, k+1, V].
    Returns (n_accepted [B] in 0..k, out_ids [B, k+1]); emit out_ids[b, :n_accepted[b] + 1]."""
    bsz, k = draft_ids.shape
    idx = draft_ids.unsqueeze(-1)                                            # [B, k, 1]
    p_x = target_probs[:, :k].gather(-1, idx).squeeze(-1).float()            # [B, k]
    q_x = draft_probs.gather(-1, idx).squeeze(-1).float()                    # [B, k]
    u = torch.stack([torch.rand(k, generator=g) for g in generators]).to(p_x.device)
    accept = u * q_x < p_x                                                   # u < p/q, no division by q = 0
    n_accepted = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)            # [B]
    # position n_accepted: residual max(p - q, 0) after a rejection, plain p for the bonus (q := 0 there)
    q_pad = torch.cat([draft_probs, draft_probs.new_zeros(bsz, 1, draft_probs.shape[-1])], dim=1)
    rows = torch.arange(bsz, device=draft_ids.device)
    p_n, q_n = target_probs[rows, n_accepted], q_pad[rows, n_accepted]      # [B, V]
    residual = (p_n - q_n).clamp_min(0)
    mass = residual.sum(dim=-1, keepdim=True)
    # mass == 0 only when p == q at that position, where a rejection has probability 0 (rounding hazard)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)
    out_ids = torch.cat([draft_ids, draft_ids.new_zeros(bsz, 1)], dim=1)     # [B, k+1]
    out_ids[rows, n_accepted] = sample_rows(residual, generators)
    return n_accepted, out_ids


def verify(draft_ids: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor | None,
           target_ids: torch.Tensor, greedy: list[bool],
           generators: list[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixed batch: rows with greedy[b] use verify_greedy (target_ids [B, k+1]), the others
    verify_sampled (draft_probs [B, k, V], target_probs [B, k+1, V]). Same returns."""
    n_accepted, out_ids = verify_greedy(draft_ids, target_ids)
    sampled = [b for b, g in enumerate(greedy) if not g]
    if sampled:
        assert draft_probs is not None and target_probs is not None, "sampled rows need both distributions"
        rows = torch.tensor(sampled, device=draft_ids.device)
        n_s, out_s = verify_sampled(draft_ids[rows], draft_probs[rows], target_probs[rows],
                                    [generators[b] for b in sampled])
        n_accepted, out_ids = n_accepted.clone(), out_ids.clone()
        n_accepted[rows], out_ids[rows] = n_s, out_s
    return n_accepted, out_ids
