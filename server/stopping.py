"""When a sequence stops, in SGLang's `finish_reason` shape.

A stop string or stop regex is checked on the decoded tail after every token, so it is honoured exactly
even when several tokens arrive in one step (speculative decoding): the caller appends tokens one at a
time. Output ids keep the token that completed the stop string; the text excludes the stop string
(SGLang), trimmed at the edge by `server.detok.output_text`. A regex is searched in the decoded last
`bound + 1` tokens, where `bound` is its longest match in characters (unbounded: the whole output), as
SGLang 0.5.23's `Req.tail_str` does.
"""
from __future__ import annotations

import re

try:
    import re._parser as sre_parse  # Python 3.11+
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

from gleanrl.server.protocol import SamplingParams

MAX_STOP_REGEX_LEN = 256      # bytes of one pattern (SGLang's limit)
UNBOUNDED = 1 << 30


def regex_max_len(pattern: str) -> int:
    """An upper bound on the characters a match of `pattern` spans (UNBOUNDED when it has none)."""
    return min(_max_len(sre_parse.parse(pattern)), UNBOUNDED)


def _max_len(sub) -> int:
    total = 0
    for token, value in sub:
        if token in (sre_parse.LITERAL, sre_parse.IN, sre_parse.ANY, sre_parse.NOT_LITERAL):
            total += 1
        elif token == sre_parse.SUBPATTERN:
            total += _max_len(value[-1])
        elif token == sre_parse.BRANCH:
            total += max(_max_len(b) for b in value[1])
        elif token in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT):
            _, most, inner = value
            total += UNBOUNDED if most == sre_parse.MAXREPEAT else most * _max_len(inner)
        elif token != sre_parse.AT:  # AT: zero-width (^, $, \b)
            total += UNBOUNDED
    return total


def compile_stop_regex(patterns: list[str]) -> list[re.Pattern]:
    """Compiled patterns; ValueError naming the field for a bad one."""
    out = []
    for p in patterns:
        if len(p.encode()) > MAX_STOP_REGEX_LEN:
            raise ValueError(f"sampling_params.stop_regex is {len(p.encode())} bytes, over the "
                             f"{MAX_STOP_REGEX_LEN}-byte limit")
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise ValueError(f"sampling_params.stop_regex {p!r} is not a valid regex: {exc}") from None
    return out


class StopChecker:
    """Per-request stop rules. `check(output_ids, total_len)` after each appended token returns None
    or a finish_reason dict."""

    def __init__(self, params: SamplingParams, eos_ids: set[int], context_length: int, tokenizer=None):
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else eos_ids)
        self.min_new_stop_ids = set(params.stop_token_ids) | eos_ids  # masked before min_new_tokens (SGLang)
        self.stops = [s for s in params.stop if s]
        self.regexes = compile_stop_regex(params.stop_regex)
        if (self.stops or self.regexes) and tokenizer is None:
            raise ValueError("stop strings and stop_regex need a tokenizer")
        self.tokenizer = tokenizer
        # a stop string of L characters spans at most 4L bytes, hence at most 4L byte-level tokens
        self.window = 4 * max((len(s) for s in self.stops), default=0) + 2
        self.regex_window = max((regex_max_len(r.pattern) for r in self.regexes), default=0) + 1
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
        if self.regexes:
            tail = self.tokenizer.decode(output_ids[-self.regex_window:], skip_special_tokens=False)
            for r in self.regexes:
                if r.search(tail):
                    return {"type": "stop", "matched": r.pattern}
        if len(output_ids) >= self.params.max_new_tokens:
            return {"type": "length", "length": self.params.max_new_tokens}
        if total_len >= self.context_length:
            return {"type": "length", "length": len(output_ids)}
        return None
