"""An iteration's accounting: the decoder's cumulative counters, and the prefill pacer.

Prefill is paced while requests decode, so that long prompts cannot take the engine from the running requests.

Unpaced, a client sending long prompts back to back keeps a prefill chunk in most iterations, and each chunk stretches
the iteration of every running request: with one such client the running ones get about half the engine, however the
prompt is chunked (`gleanrl bench load --hostile`, a prompt near the context: benign p99 2.0-2.4x alone, also with
--chunked-prefill-size 256). While any request decodes, the pacer lets prefill take at most `share` of the engine's
time, in chunks of at most STALL decode iterations' time: a running request's iteration stretches by at most that
stall, its run by about 1 / (1 - share). With nothing decoding (a batch of new requests, a GRPO step's start) prefill
takes every iteration, still in chunks of that size: a whole unpaced chunk there (a 984-token prompt on the tiny model,
41-60 ms) was what a request arriving in the gap between another client's requests waited for, the benign client's
slowest requests under `bench load --hostile` (2026-12-07). Both costs are measured, not modelled: a decode-only
iteration's seconds and prefill's seconds per token (the prefill's part of an iteration is its time less a decode-only
iteration's), as moving averages."""

from __future__ import annotations

from dataclasses import dataclass, field

STALL = 4.0  # a paced chunk's time, in decode-only iterations
EMA = 0.2  # weight of the newest measurement
PROBE = 64  # prompt tokens of the chunk that measures prefill's cost beside decoding requests


def _ema(old: float, new: float) -> float:
    return new if old == 0.0 else old + EMA * (new - old)


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


@dataclass
class PrefillPacer:
    share: float  # of the engine's time prefill may take while requests decode; 1: unpaced
    chunk: int  # the unpaced chunk (chunked_prefill_size)
    decode_s: float = 0.0  # a decode-only iteration
    token_s: float = 0.0  # prefill, per token
    balance: float = 0.0  # prefill seconds earned (> 0) or overdrawn (< 0)

    def budget(self, decoding: bool) -> tuple[int, int]:
        """Prompt tokens this iteration may prefill: (for any prompt, for short prompts fed whole). A prompt that fits
        in one paced chunk is not held back while long ones repay (a short request must not wait behind a long one),
        and those take at most one paced chunk together."""
        if self.share >= 1:
            return self.chunk, 0
        if not self.decode_s or not self.token_s:  # measure: a decode-only iteration, then a small chunk
            if not decoding:
                return self.chunk, 0
            return (min(self.chunk, PROBE) if self.decode_s else 0), 0
        paced = max(1, min(self.chunk, int(STALL * self.decode_s / self.token_s)))
        if not decoding:  # unpaced, but in paced chunks: a request arriving now waits for one, not a whole chunk
            return paced, paced
        return (0 if self.balance < 0 else paced), paced

    def record(self, decoding: bool, prefilled: int, seconds: float) -> None:
        """An iteration: whether requests decoded in it, the prompt tokens it prefilled, its wall time."""
        if prefilled:
            spent = max(seconds - self.decode_s, 0.0)  # the prefill's part
            self.token_s = _ema(self.token_s, spent / prefilled)
        else:
            spent = 0.0
            if decoding:
                self.decode_s = _ema(self.decode_s, seconds)
        if not decoding:
            self.balance = 0.0
            return
        earned = (seconds - spent) * self.share / max(1 - self.share, 1e-9)  # by the decoding part
        self.balance = min(self.balance + earned - spent, STALL * self.decode_s)  # no credit past one paced chunk
