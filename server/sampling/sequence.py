"""One request inside the engine: its prompt, the tokens sampled so far, its KV cache and its counters; the feed.

The target KV cache covers a prefix of `prompt + output_ids`; every running sequence feeds the tokens it lacks
(`feed_counts`, `total_len - cache.length`): a new request its prompt (in chunks, at most `chunked_prefill_size` prompt
tokens per iteration over all sequences), a decoding one its last sampled token, a request whose cache was flushed by a
weight update or that was retracted its whole prefix again, all rebuilt the same way. So prefill and decode share one
forward (`forward_fed`). The scheduler appends the emitted tokens one at a time and stops at EOS, a stop string or
`max_new_tokens` exactly.

When a sequence stops (`StopChecker`), in SGLang's `finish_reason` shape: a stop string or stop regex is checked on the
decoded tail after every token, so it is honoured exactly even when several tokens arrive in one step (speculative
decoding): the caller appends tokens one at a time. Output ids keep the token that completed the stop string; the text
excludes the stop string (SGLang), trimmed at the edge by `server.http.generate.detok.output_text`. Cost per token is
constant (a request must not stall the engine thread): stop strings are at most MAX_STOP_LEN characters, so the tail
decoded for them is at most 4 * MAX_STOP_LEN + 2 tokens; regexes run on RE2 (linear time, no backtracking) over the last
`bound + 1` tokens, where `bound` is the pattern's longest match in characters, capped at MAX_REGEX_WINDOW tokens.
SGLang 0.5.23 (`Req.tail_str`) searches an unbounded pattern over the whole output; here a match must lie within the
last MAX_REGEX_WINDOW tokens."""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import re2
import torch

try:
    import re._parser as sre_parse  # Python 3.11+
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

from gleanrl.server.model.kv import SeqKVCache
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import GenerateOutput, GenerateRequest, SamplingParams
from gleanrl.server.sampling.grammar import GrammarState
from gleanrl.server.sampling.prompt_scores import SCORE_CHUNK, PromptScores
from gleanrl.server.sampling.sampler import OutputCounts

MAX_STOPS = 32  # stop strings per request
MAX_STOP_LEN = 256  # characters of one stop string
MAX_STOP_REGEX = 8  # stop regexes per request
MAX_STOP_REGEX_LEN = 256  # bytes of one pattern (SGLang's limit)
MAX_REGEX_WINDOW = 512  # tokens a stop regex is searched over
UNBOUNDED = 1 << 30
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the client's 400, not a line on the server's stderr


def regex_max_len(pattern: str) -> int:
    """An upper bound on the characters a match of `pattern` spans (UNBOUNDED when it has none, or when Python's parser
    does not read an RE2-only pattern)."""
    try:
        return min(_max_len(sre_parse.parse(pattern)), UNBOUNDED)
    except (re.error, RecursionError, OverflowError):
        return UNBOUNDED


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
        total = min(total, UNBOUNDED)
    return total


def check_stops(stops: list[str]) -> None:
    """ValueError naming the field when there are too many stop strings or one is too long."""
    if len(stops) > MAX_STOPS:
        raise ValueError(f"sampling_params.stop has {len(stops)} strings, over the limit of {MAX_STOPS}")
    longest = max(stops, key=len, default="")
    if len(longest) > MAX_STOP_LEN:
        raise ValueError(
            f"sampling_params.stop has a string of {len(longest)} characters, over the limit of {MAX_STOP_LEN}"
        )


def compile_stop_regex(patterns: list[str]) -> list:
    """Compiled RE2 patterns; ValueError naming the field for a bad one (RE2 has no backreferences, no lookaround)."""
    if len(patterns) > MAX_STOP_REGEX:
        raise ValueError(f"sampling_params.stop_regex has {len(patterns)} patterns, over the limit of {MAX_STOP_REGEX}")
    out = []
    for p in patterns:
        if len(p.encode()) > MAX_STOP_REGEX_LEN:
            raise ValueError(
                f"sampling_params.stop_regex is {len(p.encode())} bytes, over the {MAX_STOP_REGEX_LEN}-byte limit"
            )
        try:
            out.append(re2.compile(p, options=_RE2_OPTIONS))
        except (re2.error, TypeError, ValueError) as exc:
            why = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise ValueError(f"sampling_params.stop_regex {p!r} is not a valid RE2 regex: {why}") from None
    return out


class StopChecker:
    """Per-request stop rules. `check(output_ids, total_len)` after each appended token returns None or a finish_reason
    dict."""

    def __init__(self, params: SamplingParams, eos_ids: set[int], context_length: int, tokenizer=None):
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else eos_ids)
        self.min_new_stop_ids = set(params.stop_token_ids) | eos_ids  # masked before min_new_tokens (SGLang)
        self.stops = [s for s in params.stop if s]
        check_stops(self.stops)
        self.patterns = list(params.stop_regex)
        self.regexes = compile_stop_regex(self.patterns)
        if (self.stops or self.regexes) and tokenizer is None:
            raise ValueError("stop strings and stop_regex need a tokenizer")
        self.tokenizer = tokenizer
        # a stop string of L characters spans at most 4L bytes, hence at most 4L byte-level tokens
        self.window = 4 * max((len(s) for s in self.stops), default=0) + 2
        bound = max((regex_max_len(p) for p in self.patterns), default=0)
        self.regex_window = min(bound + 1, MAX_REGEX_WINDOW)
        self.context_length = context_length

    def check(self, output_ids: list[int], total_len: int) -> dict | None:
        last = output_ids[-1]
        if last in self.stop_ids:
            return {"type": "stop", "matched": last}
        if self.stops:
            tail = self.tokenizer.decode(output_ids[-self.window :], skip_special_tokens=False)
            for s in self.stops:
                if s in tail:
                    return {"type": "stop", "matched": s}
        if self.regexes:
            tail = self.tokenizer.decode(output_ids[-self.regex_window :], skip_special_tokens=False)
            for p, r in zip(self.patterns, self.regexes):
                if r.search(tail):
                    return {"type": "stop", "matched": p}
        if len(output_ids) >= self.params.max_new_tokens:
            return {"type": "length", "length": self.params.max_new_tokens}
        if total_len >= self.context_length:
            return {"type": "length", "length": len(output_ids)}
        return None


Emitted = list[tuple[list[int], list[float]]]  # per sequence: new token ids and their logprobs


class SequenceStatus(enum.Enum):
    """Where a sequence is (`EngineState`'s queues): set by whoever moves it."""

    HELD = "held"  # arrived while a target update drains: waits for the new weights
    WAITING = "waiting"  # queued (new or retracted)
    RUNNING = "running"
    FINISHED = "finished"  # finished or aborted, out of every queue


@dataclass(eq=False)
class Sequence:
    req: GenerateRequest
    emit: Callable[[GenerateOutput], None]
    stopper: StopChecker
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    cache: SeqKVCache | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    sent: int = 0  # output tokens already emitted
    finish_reason: dict | None = None
    abort_message: str | None = None  # set by another thread: drop at the next chance
    spec_verify_ct: int = 0  # SD verify passes
    spec_accept_token_num: int = 0  # draft tokens those passes accepted (the bonus token not counted)
    spec_draft_token_num: int = 0  # draft tokens those passes verified
    retractions: int = 0  # times put back in the queue by a retract pause
    spec_accept_token_num_by_source: dict[str, int] = field(default_factory=dict)  # accepted drafts: group / eagle
    version_events: list[tuple[str, int]] = field(default_factory=list)  # (old version, outputs under it)
    counts: OutputCounts | None = None  # for penalised requests
    grammar: GrammarState | None = None  # for constrained requests
    token_extras: list = field(default_factory=list)  # per output position: (top, token-id) logprobs, if asked
    prompt_scores: PromptScores | None = field(init=False)  # the prompt's own logprobs, if asked (in the prefill)

    def __post_init__(self) -> None:
        self.prompt_scores = PromptScores.of(self.req)

    @property
    def scoring(self) -> bool:
        """Its prompt is being scored: it prefills (`feed_counts`), never drafts, until that is done."""
        return self.prompt_scores is not None and not self.prompt_scores.done

    @property
    def total_len(self) -> int:
        return len(self.req.input_ids) + len(self.output_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        prompt = self.req.input_ids
        return prompt[start:end] + self.output_ids[max(start - len(prompt), 0) : max(end - len(prompt), 0)]

    def weight_versions(self, current: str) -> list[dict]:
        """SGLang 0.5.23's per-segment versions (`compute_weight_version_spans`): which weight version produced output
        tokens [start, end); one span unless a target update landed mid-request."""
        n, spans = len(self.output_ids), []
        for version, end in [*self.version_events, (current, n)]:
            end = min(end, n)
            if spans and end <= spans[-1]["end"]:
                continue
            if spans and version == spans[-1]["version"]:
                spans[-1]["end"] = end
                continue
            spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
        return spans


def feed_counts(seqs: list[Sequence], budget: int, whole: int = 0) -> list[int]:
    """Tokens each sequence feeds this iteration: one to decode, or a prefill chunk while `budget` (prompt tokens per
    iteration, shared in order) lasts, a prompt being scored at most SCORE_CHUNK; a prompt that fits in what is left
    of `whole` is fed whole from it (`decode/iteration.py`: short prompts beside paced long ones)."""
    counts = []
    for s in seqs:
        pending = s.total_len - s.cache.length
        if 1 < pending <= whole and not s.scoring:
            count, whole = pending, whole - pending
        else:
            count = pending if pending <= 1 else min(pending, max(budget, 0), SCORE_CHUNK if s.scoring else pending)
            budget -= count
        counts.append(count)
    return counts


def forward_fed(runner: ModelRunner, fed: list[tuple[Sequence, int]], capture_layers: list[int] | None = None):
    """One ragged forward over (sequence, count) pairs from their cache lengths on; returns the last row's logits [B, V]
    and, with `capture_layers`, aux hidden states [N, 3*H]. The prompts being scored get their fed rows' scores."""
    tokens = [t for s, c in fed for t in s.tokens(s.cache.length, s.cache.length + c)]
    positions = [p for s, c in fed for p in range(s.cache.length, s.cache.length + c)]
    ends = list(itertools.accumulate(c for _, c in fed))
    scored = [(s, s.prompt_scores.positions(s.cache.length, c), end - c) for (s, c), end in zip(fed, ends) if s.scoring]
    rows = [end - 1 for end in ends] + [at + p - s.cache.length for s, span, at in scored for p in span]
    logits, aux = runner.forward(
        torch.tensor(tokens, device=runner.device),
        torch.tensor(positions, device=runner.device),
        [s.cache for s, _ in fed],
        [c for _, c in fed],
        capture_layers=capture_layers,
        rows=torch.tensor(rows, device=runner.device) if scored else None,
    )
    at = len(fed)
    for s, span, _ in scored:
        if span:
            s.prompt_scores.add(logits[at : at + len(span)], span)
            at += len(span)
    return logits[: len(fed)], aux
