"""When a sequence stops, in SGLang's `finish_reason` shape.

A stop string is checked on the decoded tail after every token, so it is honoured exactly even when
several tokens arrive in one step (speculative decoding): the caller appends tokens one at a time.
Output ids keep the token that completed the stop string; the text excludes the stop string (SGLang),
trimmed at the edge by `server.detok.output_text`.
"""
from __future__ import annotations

from gleanrl.server.protocol import SamplingParams


class StopChecker:
    """Per-request stop rules. `check(output_ids, total_len)` after each appended token returns None
    or a finish_reason dict."""

    def __init__(self, params: SamplingParams, eos_ids: set[int], context_length: int, tokenizer=None):
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else eos_ids)
        self.stops = [s for s in params.stop if s]
        if self.stops and tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        self.tokenizer = tokenizer
        # a stop string of L characters spans at most 4L bytes, hence at most 4L byte-level tokens
        self.window = 4 * max((len(s) for s in self.stops), default=0) + 2
        self.context_length = context_length

    def check(self, output_ids: list[int], total_len: int) -> dict | None:
        last = output_ids[-1]
        if last in self.stop_ids:
            return {"type": "stop", "matched": last}
        if self.stops:
            tail = self.tokenizer.decode(output_ids[-self.window:], skip_special_tokens=False)
            for s in self.stops:
                if s in tail:
                    return {"type": "stop", "matched": s}
        if len(output_ids) >= self.params.max_new_tokens:
            return {"type": "length", "length": self.params.max_new_tokens}
        if total_len >= self.context_length:
            return {"type": "length", "length": len(output_ids)}
        return None
