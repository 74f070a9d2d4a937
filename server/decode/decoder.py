"""What the engine's scheduler sees of a decoder, and the feed every iteration shares. `Decoder` is what the scheduler
calls (`decode`) and reads back (`counters`, `stats`, `draft_path`); the one decoder is `sd_decoder.SDDecoder` (plain
decoding is an empty draft), `sd_decoder.build_decoder` the one an engine starts with.

Every running sequence feeds the tokens its KV cache lacks (`feed_counts`): a new request its prompt (in chunks, at most
`chunked_prefill_size` prompt tokens per iteration over all sequences), a decoding one its last sampled token, a flushed
or retracted one its whole prefix again. So prefill and decode share one forward (`forward_fed`). The scheduler appends
the emitted tokens one at a time and stops at EOS, a stop string or `max_new_tokens` exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.sampling.sequence import Emitted, Sequence


@dataclass
class DecodeCounters:
    """Cumulative since start (`Engine.sd_counters`)."""

    verify_ct: int = 0  # verify passes
    verify_tokens: int = 0  # tokens they emitted
    decode_passes: int = 0  # target passes over decoding sequences,
    decode_rows: int = 0  # those sequences summed over the passes,
    decode_tokens: int = 0  # the tokens they emitted
    iterations: int = 0  # decode calls, and their wall time: whole,
    iteration_s: float = 0.0
    forward_s: float = 0.0  # in target forwards,
    drafter_s: float = 0.0  # in drafter calls
    # accepted draft tokens by source (the bonus token not counted)
    spec_accept_token_num_by_source: dict[str, int] = field(default_factory=lambda: {"group": 0, "eagle": 0})


class Decoder(Protocol):
    counters: DecodeCounters
    draft_path: str | None  # the served drafter's checkpoint (None: none served)

    def decode(self, runner: ModelRunner, seqs: list[Sequence]) -> Emitted:
        """New tokens for each of `seqs` (none for a sequence still mid-prefill); caches advance."""

    def stats(self) -> dict: ...

    def set_drafter(self, drafter, path: str | None) -> None: ...


def feed_counts(seqs: list[Sequence], budget: int) -> list[int]:
    """Tokens each sequence feeds this iteration: one to decode, or a prefill chunk while `budget` (prompt tokens per
    iteration, shared in order) lasts."""
    counts = []
    for s in seqs:
        pending = s.total_len - s.cache.length
        count = pending if pending <= 1 else min(pending, max(budget, 0))
        budget -= count
        counts.append(count)
    return counts


def forward_fed(runner: ModelRunner, fed: list[tuple[Sequence, int]], capture_layers: list[int] | None = None):
    """One ragged forward over (sequence, count) pairs from their cache lengths on; returns the last row's logits [B, V]
    and, with `capture_layers`, aux hidden states [N, 3*H]."""
    tokens = [t for s, c in fed for t in s.tokens(s.cache.length, s.cache.length + c)]
    positions = [p for s, c in fed for p in range(s.cache.length, s.cache.length + c)]
    return runner.forward(
        torch.tensor(tokens, device=runner.device),
        torch.tensor(positions, device=runner.device),
        [s.cache for s, _ in fed],
        [c for _, c in fed],
        capture_layers=capture_layers,
    )
