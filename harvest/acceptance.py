"""Expected acceptance length of a drafter on held-out captured samples.

From every start slot i whose token i+2 is learnable, a k-step greedy draft chain is accepted while it equals the
sample's tokens; until the first mismatch the drafts *are* those tokens, so one TTT unroll on the sample gives
every chain. Accept length counts the bonus token, as SGLang's `spec_accept_length`: 1 + accepted, in [1, k+1];
exact for greedy samples, a proxy otherwise. `mode="sampled"`: speculative sampling at T = 1, drafter softmax q
against the soft labels p (top-k, renormalised): step s is accepted with probability sum_x min(p, q) =
1 - TV(p, q), so length = 1 + sum_s prod_{j<=s} alpha_j. Smoother: better to compare drafters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gleanrl.harvest.drafter import Eagle3Drafter
from gleanrl.harvest.train_step import Tensors, collate, ttt_unroll


def accept_lengths(
    logits: list[torch.Tensor], ids: torch.Tensor, starts: torch.Tensor, draft_to_target: torch.Tensor
) -> torch.Tensor:
    """logits: k steps [B,T,Vd]; ids [B,T]; starts [B,T] bool -> [n_starts] 1 + leading run of drafted == actual."""
    run = torch.ones_like(ids, dtype=torch.bool)
    length = torch.ones_like(ids, dtype=torch.float32)
    for s, lg in enumerate(logits):
        drafted = draft_to_target[lg.argmax(-1)]  # [B,T] target ids
        actual = F.pad(ids[:, s + 2 :], (0, s + 2), value=-1)
        run = run & (drafted == actual)  # actual: token i+s+2, -1 past the end
        length = length + run.float()
    return length[starts]


def expected_accept_lengths(logits: list[torch.Tensor], labels: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """logits: k steps [B,T,Vd]; labels [B,T,Vd] (row j: target distribution predicting token j+1);
    starts [B,T] bool -> expected accept lengths of speculative sampling [n_starts]."""
    run = torch.ones(labels.shape[:2], device=labels.device)
    length = torch.ones_like(run)
    for s, lg in enumerate(logits):
        p = F.pad(labels[:, s + 1 :], (0, 0, 0, s + 1))  # zero rows past the end
        run = run * torch.minimum(p, torch.softmax(lg.float(), -1)).sum(-1)
        length = length + run
    return length[starts]


@torch.no_grad()
def acceptance_sums(
    drafter: Eagle3Drafter, samples: list[Tensors], k: int = 4, batch_size: int = 8, mode: str = "greedy"
) -> list[tuple[float, int]]:
    """Per sample: (sum of accept lengths over its start slots, their number): cacheable, poolable."""
    if mode not in ("greedy", "sampled"):
        raise ValueError(f"mode must be 'greedy' or 'sampled', got {mode!r}")
    was_training = drafter.training
    drafter.eval()
    out: list[tuple[float, int]] = []
    for lo in range(0, len(samples), batch_size):
        b = collate(samples[lo : lo + batch_size], drafter)
        logits = ttt_unroll(drafter, b["ids"], b["aux"], b["valid"], k)
        ids = b["ids"].masked_fill(~b["valid"], -2)
        starts = F.pad((b["valid"] & b["loss_mask"])[:, 2:], (0, 2))
        if mode == "greedy":
            lengths = accept_lengths(logits, ids, starts, drafter.draft_to_target())
        else:
            lengths = expected_accept_lengths(logits, b["labels"], starts)
        rows = torch.arange(ids.shape[0]).unsqueeze(1).expand_as(ids)[starts.cpu()]
        sums = torch.zeros(ids.shape[0]).index_add_(0, rows, lengths.float().cpu())
        counts = torch.bincount(rows, minlength=ids.shape[0])
        out += [(float(s), int(c)) for s, c in zip(sums, counts)]
    drafter.train(was_training)
    return out


def acceptance_length(
    drafter: Eagle3Drafter, samples: list[Tensors], k: int = 4, batch_size: int = 8, mode: str = "greedy"
) -> float:
    """Mean accept length over all start slots of `samples` (mode "greedy" or "sampled", as above)."""
    if not samples:
        raise ValueError("acceptance_length needs at least one held-out sample")
    sums = acceptance_sums(drafter, samples, k, batch_size, mode)
    return sum(s for s, _ in sums) / max(sum(c for _, c in sums), 1)
