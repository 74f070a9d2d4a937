"""EAGLE-3 training-time test (TTT): the drafter unrolled `length` steps on its own outputs, step s scored against
the target's soft labels with weight decay**s (SpecForge: 0.8).

For every start i at once (alignment as in `harvest.drafter`), step s feeds token_{i+s+1} with the previous
step's pre-norm output (step 0: fc(aux_i)) at rope position i+s and predicts token_{i+s+2}, labelled by the
target's distribution at i+s+1. It attends to true slots 0..i (causal step-0 keys) plus its chain's keys of steps
1..s at i: what drafting s+1 tokens after slot i sees (tested against the cached chain). SpecForge's mask also
hides step-0 keys i-s+1..i from step s; we follow inference. A batch is a list of spool samples: `input_ids` [T],
`aux_hidden` [T, n*Ht], `topk_ids`/`topk_probs` [T, k] or `target_probs` [T, V], optional `loss_mask` [T].

Acceptance (`acceptance_sums`, the push gate's score): from every start slot i whose token i+2 is learnable, a k-step
greedy draft chain is accepted while it equals the sample's tokens; until the first mismatch the drafts *are* those
tokens, so one TTT unroll gives every chain. Accept length counts the bonus token, as SGLang's `spec_accept_length`:
1 + accepted, in [1, k+1]; exact for greedy samples, a proxy otherwise. `mode="sampled"`: speculative sampling at
T = 1, drafter softmax q against the soft labels p (top-k, renormalised): step s is accepted with probability
sum_x min(p, q) = 1 - TV(p, q), so length = 1 + sum_s prod_{j<=s} alpha_j. Smoother: better to compare drafters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gleanrl.base.batches import length_batches as like_lengths
from gleanrl.harvest.drafter import Eagle3Drafter

Tensors = dict[str, torch.Tensor]  # one sample, as the spool stores it (`Sample.tensors()`)


def draft_labels(sample: Tensors, drafter: Eagle3Drafter) -> torch.Tensor:
    """Soft labels over the draft vocabulary [T, V_draft], renormalised (rows with no mass are zero)."""
    d2t = drafter.draft_to_target().cpu()
    dense = sample.get("target_probs")
    if dense is None:
        ids, probs = sample["topk_ids"].long(), sample["topk_probs"].float()
        t2d = torch.full((drafter.config.vocab_size,), -1, dtype=torch.long)
        t2d[d2t] = torch.arange(d2t.shape[0])
        slot = t2d[ids]  # [T, k], -1 outside draft vocab
        out = torch.zeros(ids.shape[0], d2t.shape[0] + 1)
        out.scatter_add_(1, torch.where(slot < 0, d2t.shape[0], slot), probs)
        p = out[:, :-1]
    else:
        p = dense.float()[:, d2t]
    return p / p.sum(-1, keepdim=True).clamp_min(1e-12)


def collate(batch: list[Tensors], drafter: Eagle3Drafter) -> dict[str, torch.Tensor]:
    """Right-pad samples: ids [B,T], aux [B,T,n*Ht], labels [B,T,Vd], valid/loss_mask [B,T]."""
    device, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
    B, T = len(batch), max(int(s["input_ids"].shape[0]) for s in batch)
    out = {
        "ids": torch.zeros(B, T, dtype=torch.long),
        "aux": torch.zeros(B, T, drafter.fc.in_features),
        "labels": torch.zeros(B, T, drafter.config.draft_vocab_size),
        "valid": torch.zeros(B, T, dtype=torch.bool),
        "loss_mask": torch.zeros(B, T, dtype=torch.bool),
    }
    for b, s in enumerate(batch):
        n = int(s["input_ids"].shape[0])
        out["ids"][b, :n] = s["input_ids"]
        out["aux"][b, :n] = s["aux_hidden"].float()
        out["labels"][b, :n] = draft_labels(s, drafter)
        out["valid"][b, :n] = True
        mask = s.get("loss_mask")
        out["loss_mask"][b, :n] = True if mask is None else mask.bool()
    out["aux"] = out["aux"].to(dtype)
    return {k: v.to(device) for k, v in out.items()}


def chain_attention(
    q: torch.Tensor,
    k0: torch.Tensor,
    v0: torch.Tensor,
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    key_valid: torch.Tensor,
) -> torch.Tensor:
    """q [B,T,nh,d]; k0, v0 [B,T,nkv,d] step-0 keys (causal); ks, vs: s tensors [B,T,nkv,d], each
    seen only by the query at its own position; key_valid [B,T]. -> [B,T,nh,d]."""
    rep = q.shape[2] // k0.shape[2]
    k0, v0 = k0.repeat_interleave(rep, 2), v0.repeat_interleave(rep, 2)
    scale = q.shape[-1] ** -0.5
    s0 = torch.einsum("bind,bjnd->bnij", q, k0) * scale  # [B,nh,T,T]
    T = q.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril() & key_valid[:, None, None, :]
    s0 = s0.masked_fill(~allowed, float("-inf"))
    diag = [((q * k.repeat_interleave(rep, 2)).sum(-1) * scale).transpose(1, 2)[..., None] for k in ks]
    p = torch.softmax(torch.cat([s0, *diag], dim=-1).float(), dim=-1).to(q.dtype)  # [B,nh,T,T+s]
    out = torch.einsum("bnij,bjnd->bind", p[..., :T], v0)
    for j, v in enumerate(vs):
        out = out + p[..., T + j].transpose(1, 2)[..., None] * v.repeat_interleave(rep, 2)
    return out


def ttt_unroll(
    drafter: Eagle3Drafter, ids: torch.Tensor, aux: torch.Tensor, valid: torch.Tensor, length: int
) -> list[torch.Tensor]:
    """ids [B,T]; aux [B,T,n*Ht]; valid [B,T] -> `length` draft logits [B,T,Vd]; step s at i predicts i+s+2."""
    B, T = ids.shape
    r = drafter.project(aux)
    pos = torch.arange(T, device=ids.device).expand(B, T)
    ks, vs, logits = [], [], []
    for s in range(length):
        tok = F.pad(ids[:, s + 1 :], (0, s + 1))  # token_{i+s+1}
        q, k, v = drafter.qkv(tok, r, pos + s)
        if s == 0:
            k0, v0 = k, v
        else:
            ks.append(k)
            vs.append(v)
        r = drafter.finish(chain_attention(q, k0, v0, ks, vs, valid), r)
        logits.append(drafter.draft_logits(r))
    return logits


def ttt_loss(
    logits: list[torch.Tensor], labels: torch.Tensor, valid: torch.Tensor, loss_mask: torch.Tensor, decay: float = 0.8
) -> tuple[torch.Tensor, dict[str, float]]:
    """logits: per step [B,T,Vd]; labels [B,T,Vd] (row j: target distribution at j, predicting j+1).
    Step s at i is scored iff token i+s+2 exists and is in the loss mask. -> (loss, metrics)."""
    learn = valid & loss_mask
    denom = learn[:, 2:].sum().clamp_min(1)
    total, metrics = logits[0].new_zeros(()), {}
    for s, lg in enumerate(logits):
        m = F.pad(learn[:, s + 2 :], (0, s + 2))  # [B,T]
        p = F.pad(labels[:, s + 1 :], (0, 0, 0, s + 1))  # [B,T,Vd]
        m = m & (p.sum(-1) > 0)
        ce = -(p * torch.log_softmax(lg.float(), -1)).sum(-1)
        loss_s = (ce * m).sum() / denom
        total = total + decay**s * loss_s
        hits = (lg.argmax(-1) == p.argmax(-1)) & m
        metrics[f"loss_{s}"] = float(loss_s.detach())
        metrics[f"acc_{s}"] = float(hits.sum() / m.sum().clamp_min(1))
    metrics["loss"] = float(total.detach())
    return total, metrics


def bf16_fast(device: str | torch.device = "cpu") -> bool:
    """Whether bf16 pays on `device`: CUDA, or a CPU with native bf16 (AVX-512 BF16 or AMX). On AVX2 it is
    emulated: an EPYC's 64-row policy forward took 160 ms in bf16 vs 42 in float32 (one row: 6 vs 13)."""
    if torch.device(device).type != "cpu":
        return True
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, p, lambda: False)() for p in probes)


def length_batches(lengths: list[int], max_tokens: int, max_seqs: int, generator: torch.Generator) -> list[list[int]]:
    """`base.batches.length_batches` (like lengths together, within `max_tokens` padded tokens and `max_seqs`
    sequences) with ties and the batches' order drawn from `generator`."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    batches = like_lengths([lengths[i] for i in order], max_seqs, max_tokens)
    return [[order[j] for j in batches[k]] for k in torch.randperm(len(batches), generator=generator).tolist()]


def make_optimizer(drafter: Eagle3Drafter, lr: float = 1e-3, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def train_step(
    drafter: Eagle3Drafter,
    optimizer: torch.optim.Optimizer,
    batch: list[Tensors],
    length: int = 4,
    decay: float = 0.8,
    max_grad_norm: float = 1.0,
    bf16: bool = False,
) -> dict[str, float]:
    """One optimizer step of TTT; -> loss, per-step loss_s/acc_s, tokens. `bf16`: autocast matmuls (master
    weights and loss stay float32; see `bf16_fast()`)."""
    drafter.train()
    b = collate(batch, drafter)
    with torch.autocast(b["ids"].device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = ttt_unroll(drafter, b["ids"], b["aux"], b["valid"], length)
    loss, metrics = ttt_loss(logits, b["labels"], b["valid"], b["loss_mask"], decay)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in drafter.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()
    drafter.eval()
    metrics["tokens"] = int(b["valid"].sum())
    return metrics


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
