"""Continuous batching: a waiting queue and a running set; requests join and leave between iterations.

Every running sequence feeds the tokens its KV cache lacks (`total_len - cache.length`): a new request
feeds its prompt (chunked under `prefill_chunk`), a decoding one its last sampled token, a request whose
cache was flushed by a weight update its whole prefix again. So prefill and decode share one forward.
`decode_step` is the one replaceable method: speculative decoding substitutes its own for the batch.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from gleanrl.server.kv import SeqKVCache
from gleanrl.server.kv_pool import KVPool
from gleanrl.server.model_runner import ModelRunner
from gleanrl.server.protocol import GenerateOutput, GenerateRequest
from gleanrl.server.sampler import sample_next
from gleanrl.server.stopping import StopChecker


@dataclass(eq=False)
class Sequence:
    req: GenerateRequest
    emit: Callable[[GenerateOutput], None]
    stopper: StopChecker
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    cache: SeqKVCache | None = None
    sent: int = 0                        # output tokens already emitted
    finish_reason: dict | None = None
    abort_message: str | None = None     # set by another thread: drop at the next chance
    spec_verify_ct: int = 0
    spec_accepted: int = 0               # tokens emitted by verify passes (SD)
    counts: object | None = None         # server.penalties.OutputCounts, for penalised requests
    token_extras: list = field(default_factory=list)  # per output position: (top, token-id) logprobs, if asked

    @property
    def total_len(self) -> int:
        return len(self.req.input_ids) + len(self.output_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        prompt = self.req.input_ids
        return (prompt[start:end] if start < len(prompt) else []) + \
            self.output_ids[max(start - len(prompt), 0):max(end - len(prompt), 0)]


Emitted = list[tuple[list[int], list[float]]]  # per sequence: new token ids and their logprobs
SD_MARGIN = 20  # room past the context length for a verify pass's draft tokens (k <= 16)


class Scheduler:
    def __init__(self, runner: ModelRunner, max_running: int, prefill_chunk: int = 1024,
                 context_length: int | None = None):
        self.runner = runner
        self.pool = KVPool.for_runner(runner, max_running, context_length + SD_MARGIN) if context_length else None
        self.max_running = max_running
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.weight_version = "default"
        self.draft_weight_version: str | None = None
        self.generation_tokens_total = 0
        self.urgent = False  # a first token or a final update was emitted: deliver without delay

    def admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting.popleft()
            seq.cache = self.new_cache(seq)
            self.running.append(seq)

    def new_cache(self, seq: Sequence) -> SeqKVCache:
        """A slot of the pool when the sequence's longest possible length fits, else its own cache."""
        longest = min(len(seq.req.input_ids) + seq.req.params.max_new_tokens, seq.stopper.context_length)
        if self.pool is not None and longest + SD_MARGIN <= self.pool.capacity:
            cache = self.pool.acquire()
            if cache is not None:
                return cache
        return self.runner.new_cache(capacity=min(seq.total_len + 64, 4096))

    def free_cache(self, seq: Sequence) -> None:
        if seq.cache is not None and self.pool is not None:
            self.pool.release(seq.cache)
        seq.cache = None

    def step(self) -> list[Sequence]:
        """One iteration over the running set. Emits deltas of the unfinished sequences and returns the
        finished ones, which the caller removes and then emits (so a finished request's slot is free
        before its consumer hears of it)."""
        seqs = [s for s in self.running if s.abort_message is None]
        finished = []
        for seq, (ids, lps) in zip(seqs, self.decode_step(seqs)):
            for tok, lp in zip(ids, lps):
                seq.output_ids.append(tok)
                seq.output_logprobs.append(lp)
                seq.finish_reason = seq.stopper.check(seq.output_ids, seq.total_len)
                if seq.finish_reason:
                    break
            if seq.finish_reason:
                finished.append(seq)
            elif len(seq.output_ids) > seq.sent:
                self.emit(seq)
        return finished

    def emit(self, seq: Sequence, abort_message: str | None = None) -> None:
        new = len(seq.output_ids) - seq.sent
        self.generation_tokens_total += new
        self.urgent |= seq.sent == 0 and new > 0
        if abort_message is not None:
            seq.finish_reason = {"type": "abort", "message": abort_message}
        seq.emit(GenerateOutput(
            rid=seq.req.rid, new_ids=seq.output_ids[seq.sent:], new_logprobs=seq.output_logprobs[seq.sent:],
            finished=seq.finish_reason is not None, finish_reason=seq.finish_reason,
            prompt_tokens=len(seq.req.input_ids), completion_tokens=len(seq.output_ids),
            weight_version=self.weight_version, draft_weight_version=self.draft_weight_version,
            spec_verify_ct=seq.spec_verify_ct,
            spec_accept_length=seq.spec_accepted / seq.spec_verify_ct if seq.spec_verify_ct else 0.0,
            new_top_logprobs=[top for top, _ in seq.token_extras[seq.sent:len(seq.output_ids)]],
            new_token_ids_logprobs=[ids for _, ids in seq.token_extras[seq.sent:len(seq.output_ids)]]))
        seq.sent = len(seq.output_ids)

    def decode_step(self, seqs: list[Sequence]) -> Emitted:
        """One target forward over the ragged batch; samples one token for each sequence whose cache
        then covers its whole prefix (a sequence still mid-prefill gets none)."""
        feeds, budget = [], self.prefill_chunk
        for s in seqs:
            pending = s.total_len - s.cache.length
            count = pending if pending <= 1 else min(pending, max(budget, 0))
            budget -= count
            feeds.append(count)
        fed = [(s, c) for s, c in zip(seqs, feeds) if c > 0]
        if not fed:
            return [([], []) for _ in seqs]
        tokens, positions = [], []
        for s, c in fed:
            start = s.cache.length
            tokens += s.tokens(start, start + c)
            positions += range(start, start + c)
        device = self.runner.device
        logits, _ = self.runner.forward(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                                        [s.cache for s, _ in fed], [c for _, c in fed])
        done = [i for i, (s, c) in enumerate(fed) if s.cache.length == s.total_len]
        new = self.sample_rows(logits[done], [fed[i][0] for i in done])
        by_seq = {id(fed[i][0]): new[j] for j, i in enumerate(done)}
        return [by_seq.get(id(s), ([], [])) for s in seqs]

    @staticmethod
    def sample_rows(logits: torch.Tensor, seqs: list[Sequence]) -> Emitted:
        """logits [B, V] for B sequences -> one (token, logprob) each (`server.sampler.sample_next`)."""
        return sample_next(logits, seqs)
