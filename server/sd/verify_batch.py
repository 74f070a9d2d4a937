"""One verify pass over a ragged batch: from the target's logits of every sequence's [last token, drafts]
to one `verify` call, and the logprobs of what it emits.

The logits of all sequences are concatenated, [N, V] with N = sum(k_b + 1); `verify_batch` gathers them
into [B, K+1] rows (K the longest draft; padding repeats a sequence's last row and is never accepted),
processes p only for the sampled rows, and pads their draft distributions q with zeros.
"""
from __future__ import annotations

import torch

from gleanrl.server.sampler import processed_probs, record_extras, token_logprobs
from gleanrl.server.sd.verify import verify
from gleanrl.server.sequence import Sequence


def verify_batch(logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]], qs: list[torch.Tensor | None],
                 prm: dict[str, torch.Tensor]) -> tuple[list[int], torch.Tensor, list[int]]:
    """All sequences' drafts in one `verify` call, padded to the longest draft K. Returns
    (n_accepted [B], out_ids [B, K+1], each sequence's first row in `logits`)."""
    lens = torch.tensor([len(d) for d in drafts])                          # [B]
    k, device = int(lens.max()), logits.device
    offsets = (torch.cumsum(lens + 1, 0) - (lens + 1)).tolist()
    cols = torch.minimum(torch.arange(k + 1)[None], lens[:, None])         # [B, K+1], padding repeats the last
    rows = (torch.tensor(offsets)[:, None] + cols).to(device)              # [B, K+1] rows of logits
    draft_ids = torch.tensor([d + [0] * (k - len(d)) for d in drafts], device=device)
    greedy = [s.req.params.temperature <= 0 for s in seqs]
    sampled = [b for b, g in enumerate(greedy) if not g]
    p = q = None
    if sampled:
        pick = {key: v[sampled].repeat_interleave(k + 1).to(device) for key, v in prm.items()}
        p = processed_probs(logits[rows[sampled].reshape(-1)], pick["temperature"], pick["top_k"],
                            pick["top_p"], pick["min_p"]).view(len(sampled), k + 1, -1)   # [S, K+1, V]
        q = p.new_zeros(len(sampled), k, p.shape[-1])                                     # [S, K, V]
        for j, b in enumerate(sampled):
            q[j, :len(drafts[b])] = qs[b]
    n_acc, out_ids = verify(draft_ids, logits.argmax(-1)[rows], greedy, lens.to(device), q, p,
                            [seqs[b].generator for b in sampled])
    return n_acc.tolist(), out_ids, offsets


def emitted_logprobs(logits: torch.Tensor, seqs: list[Sequence], n_acc: list[int], out_ids: torch.Tensor,
                     offsets: list[int], temperature: torch.Tensor) -> list[list[float]]:
    """SGLang's logprob of every emitted token, for the sequences that asked (else 0.0, as the plain step)."""
    want = [b for b, s in enumerate(seqs) if s.req.return_logprob]
    lps = [[0.0] * (n + 1) for n in n_acc]
    if want:
        rows = torch.tensor([offsets[b] + j for b in want for j in range(n_acc[b] + 1)], device=logits.device)
        ids = torch.cat([out_ids[b, :n_acc[b] + 1] for b in want])
        temp = torch.cat([temperature[b].expand(n_acc[b] + 1) for b in want]).to(logits.device)
        flat = token_logprobs(logits[rows], ids, temp).tolist()
        for b in want:
            lps[b], flat = flat[:n_acc[b] + 1], flat[n_acc[b] + 1:]
    return lps


def emitted_extras(logits: torch.Tensor, seqs: list[Sequence], n_acc: list[int], offsets: list[int],
                   temperature: torch.Tensor) -> None:
    """Top / token-id logprobs of every emitted token, from its verify row, for the sequences that asked."""
    asking = [b for b, s in enumerate(seqs) if s.req.top_logprobs_num > 0 or s.req.token_ids_logprob]
    if asking:
        emitted = [(offsets[b] + j, b) for b in asking for j in range(n_acc[b] + 1)]
        rows = torch.tensor([r for r, _ in emitted], device=logits.device)
        record_extras(logits[rows], [seqs[b] for _, b in emitted], temperature[[b for _, b in emitted]])
