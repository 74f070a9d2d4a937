"""The decoder interface and the plain step's pieces: one iteration over the running sequences. The
one decoder (`server/sd/decoder.py`) decodes plainly (an empty draft) with `forward_fed`
and `sample_next`.

Every running sequence feeds the tokens its KV cache lacks: a new request its prompt (chunked under
the prefill budget), a decoding one its last sampled token, a flushed or retracted one its whole
prefix again. So prefill and decode share one forward.
"""
from __future__ import annotations

from typing import Protocol

import torch

from gleanrl.server.engine import sampler
from gleanrl.server.engine.sequence import Emitted, Sequence
from gleanrl.server.model.runner import ModelRunner


class Decoder(Protocol):
    def decode(self, runner: ModelRunner, seqs: list[Sequence]) -> Emitted:
        """New tokens for each of `seqs` (none for a sequence still mid-prefill); caches advance."""

    def stats(self) -> dict: ...


def feed_counts(seqs: list[Sequence], budget: int) -> list[int]:
    """Tokens each sequence feeds this iteration: one to decode, or a prefill chunk while `budget`
    (prompt tokens per iteration, shared in order) lasts."""
    counts = []
    for s in seqs:
        pending = s.total_len - s.cache.length
        count = pending if pending <= 1 else min(pending, max(budget, 0))
        budget -= count
        counts.append(count)
    return counts


def forward_fed(runner: ModelRunner, fed: list[tuple[Sequence, int]],
                capture_layers: list[int] | None = None):
    """One ragged forward over (sequence, count) pairs from their cache lengths on; returns the last
    row's logits [B, V] and, with `capture_layers`, aux hidden states [N, 3*H]."""
    tokens = [t for s, c in fed for t in s.tokens(s.cache.length, s.cache.length + c)]
    positions = [p for s, c in fed for p in range(s.cache.length, s.cache.length + c)]
    device = runner.device
    return runner.forward(torch.tensor(tokens, device=device),
                          torch.tensor(positions, device=device), [s.cache for s, _ in fed],
                          [c for _, c in fed], capture_layers=capture_layers)


def sample_next(logits: torch.Tensor, seqs: list[Sequence]) -> Emitted:
    """logits [B, V] for B sequences -> one (token, logprob) each (`server.sampler.sample_next`:
    penalties, logit_bias, sampling, returned and top / token-id logprobs)."""
    return sampler.sample_next(logits, seqs)
