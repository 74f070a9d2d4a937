"""Logits processing that depends on the request and its output so far, as pure tensor functions: SGLang's penaltylib
(frequency, presence, repetition penalties; min_new_tokens) and `logit_bias`.

Order (SGLang 0.5.23's overlap path, `sampling_batch_info._apply_pre/post_grammar_logits_transforms`): additive terms
(frequency, presence, min_new_tokens' -inf on EOS and stop ids), then the repetition scaling, then `logit_bias`;
temperature and the top-k/top-p/min-p filters come after (`sampler`). The counts are over output tokens only, never the
prompt, as SGLang's `cumulate_output_tokens`.

Speculative decoding verifies k drafts in one pass: position j of the window is processed with the counts of the output
plus drafts d_1..d_j (`window_counts`), i.e. exactly what plain decoding would have used had it emitted those tokens, so
verification is against the penalised target (lossless)."""

from __future__ import annotations

import torch

from gleanrl.server.protocol import SamplingParams


class OutputCounts:
    """Per-sequence token counts of the output so far, [V], grown incrementally (output ids only grow)."""

    def __init__(self, vocab_size: int, device: torch.device | str = "cpu"):
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        self.seen = 0

    def update(self, output_ids: list[int]) -> torch.Tensor:
        new = output_ids[self.seen :]
        if new:
            idx = torch.tensor(new, dtype=torch.long, device=self.counts.device)
            self.counts.index_add_(0, idx, torch.ones_like(idx, dtype=torch.float32))
            self.seen = len(output_ids)
        return self.counts


def window_counts(counts: torch.Tensor, drafts: list[int]) -> torch.Tensor:
    """counts [V], k drafts -> [k+1, V]: row j counts the output plus drafts[:j]."""
    rows = counts[None].repeat(len(drafts) + 1, 1)
    if drafts:
        hot = torch.zeros(len(drafts), counts.shape[0], device=counts.device)
        hot[torch.arange(len(drafts)), torch.tensor(drafts, device=counts.device)] = 1.0
        rows[1:] += hot.cumsum(0)
    return rows


def penalise(
    logits: torch.Tensor,
    counts: torch.Tensor,
    out_len: torch.Tensor,
    freq: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
    min_new: torch.Tensor,
    stop_mask: torch.Tensor,
    bias: torch.Tensor,
) -> torch.Tensor:
    """logits, counts [N, V]; out_len (output tokens before the row), min_new [N] long; freq, presence, repetition [N];
    stop_mask [N, V] bool (EOS and stop ids); bias [N, V]. Returns new logits [N, V]."""
    x = logits.float() - freq[:, None] * counts - presence[:, None] * (counts > 0)
    x = x.masked_fill(stop_mask & (out_len < min_new)[:, None], float("-inf"))
    scale = torch.where(counts > 0, repetition[:, None], torch.ones_like(x))
    x = torch.where(x < 0, x * scale, x / scale)
    return x + bias


def stop_mask_row(stop_ids: set[int], vocab_size: int, device) -> torch.Tensor:
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    ids = [t for t in stop_ids if 0 <= t < vocab_size]
    if ids:
        mask[torch.tensor(ids, device=device)] = True
    return mask


def bias_row(bias: dict[int, float], vocab_size: int, device) -> torch.Tensor:
    row = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    if bias:
        row[torch.tensor(list(bias), device=device)] = torch.tensor(list(bias.values()), device=device)
    return row


def penalise_rows(
    logits: torch.Tensor,
    params: list[SamplingParams],
    counts: list[torch.Tensor],
    out_lens: list[int],
    stop_ids: list[set[int]],
) -> torch.Tensor:
    """Row-wise `penalise` from per-row params, counts [V], output lengths and min_new_tokens stop ids."""
    vocab, dev = logits.shape[-1], logits.device
    f32 = dict(dtype=torch.float32, device=dev)
    return penalise(
        logits,
        torch.stack(counts).to(dev),
        torch.tensor(out_lens, device=dev),
        torch.tensor([p.frequency_penalty for p in params], **f32),
        torch.tensor([p.presence_penalty for p in params], **f32),
        torch.tensor([p.repetition_penalty for p in params], **f32),
        torch.tensor([p.min_new_tokens for p in params], device=dev),
        torch.stack([stop_mask_row(s, vocab, dev) for s in stop_ids]),
        torch.stack([bias_row(p.logit_bias, vocab, dev) for p in params]),
    )
