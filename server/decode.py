"""Decoders: one iteration over the running sequences. `PlainDecoder` runs one target forward per
iteration; the speculative decoder (`server/sd/decoder.py`) has the same interface and falls back to it.

Every running sequence feeds the tokens its KV cache lacks: a new request its prompt (chunked under the
prefill budget), a decoding one its last sampled token, a flushed or retracted one its whole prefix
again. So prefill and decode share one forward.
"""
from __future__ import annotations

from typing import Protocol

import torch

from gleanrl.server import sampler
from gleanrl.server.model_runner import ModelRunner
from gleanrl.server.sequence import Emitted, Sequence


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


def forward_fed(runner: ModelRunner, fed: list[tuple[Sequence, int]], capture_layers: list[int] | None = None):
    """One ragged forward over (sequence, count) pairs from their cache lengths on; returns the last
    row's logits [B, V] and, with `capture_layers`, aux hidden states [N, 3*H]."""
    tokens = [t for s, c in fed for t in s.tokens(s.cache.length, s.cache.length + c)]
    positions = [p for s, c in fed for p in range(s.cache.length, s.cache.length + c)]
    device = runner.device
    return runner.forward(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                          [s.cache for s, _ in fed], [c for _, c in fed], capture_layers=capture_layers)


def sample_next(logits: torch.Tensor, seqs: list[Sequence]) -> Emitted:
    """logits [B, V] for B sequences -> one (token, logprob) each (`server.sampler.sample_next`: penalties,
    logit_bias, sampling, returned and top / token-id logprobs)."""
    return sampler.sample_next(logits, seqs)


class PlainDecoder:
    def __init__(self, prefill_chunk: int = 1024):
        if prefill_chunk < 1:
            raise ValueError("prefill_chunk must be >= 1")
        self.prefill_chunk = prefill_chunk

    def decode(self, runner: ModelRunner, seqs: list[Sequence]) -> Emitted:
        fed = [(s, c) for s, c in zip(seqs, feed_counts(seqs, self.prefill_chunk)) if c > 0]
        if not fed:
            return [([], []) for _ in seqs]
        logits, _ = forward_fed(runner, fed)
        done = [i for i, (s, _) in enumerate(fed) if s.cache.length == s.total_len]
        new = sample_next(logits[done], [fed[i][0] for i in done])
        by_seq = {id(fed[i][0]): new[j] for j, i in enumerate(done)}
        return [by_seq.get(id(s), ([], [])) for s in seqs]

    def stats(self) -> dict:
        return {"avg_spec_accept_length": 0.0, "spec_accept_histogram": []}
