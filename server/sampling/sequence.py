"""One request inside the engine: its prompt, the tokens sampled so far, its KV cache and its counters.

The target KV cache covers a prefix of `prompt + output_ids`; the decoders feed whatever it lacks
(`total_len - cache.length` tokens), so a new request, a request whose cache was flushed by a weight update and a
retracted request are all rebuilt the same way."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gleanrl.server.model.kv import SeqKVCache
from gleanrl.server.protocol import GenerateOutput, GenerateRequest
from gleanrl.server.sampling.grammar import GrammarState
from gleanrl.server.sampling.penalties import OutputCounts
from gleanrl.server.sampling.stopping import StopChecker

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
