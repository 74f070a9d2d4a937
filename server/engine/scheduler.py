"""Continuous batching over the engine state: requests join and leave the running set between iterations.

The scheduler owns the KV slots and the request lifecycle (admit, step, retract, finish); the decoder it is handed does
the forward. Every method but `step`'s decoder call runs under the state's lock."""

from __future__ import annotations

from gleanrl.server.decode.sd_decoder import SDDecoder
from gleanrl.server.engine.state import EngineState
from gleanrl.server.model.kv import SeqKVCache
from gleanrl.server.model.kv_pool import KVPool
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import GenerateOutput
from gleanrl.server.sampling.sequence import Sequence, SequenceStatus

SD_MARGIN = 20  # room past the context length for a verify pass's draft tokens (k <= 16)


class Scheduler:
    def __init__(self, state: EngineState, runner: ModelRunner, max_running: int, context_length: int | None = None):
        self.state, self.runner, self.max_running = state, runner, max_running
        self.pool_length = context_length + SD_MARGIN if context_length else None
        self.pool: KVPool | None = None
        self.restore_pool()

    def restore_pool(self) -> None:
        if self.pool_length:
            self.pool = KVPool.for_runner(self.runner, self.max_running, self.pool_length)

    def admit(self) -> None:
        st = self.state
        while st.waiting and len(st.running) < self.max_running:
            seq = st.waiting.popleft()
            seq.cache, seq.status = self.new_cache(seq), SequenceStatus.RUNNING
            st.running.append(seq)

    def new_cache(self, seq: Sequence) -> SeqKVCache:
        """A slot of the pool when the sequence's longest possible length fits, else its own cache."""
        longest = min(len(seq.req.input_ids) + seq.req.params.max_new_tokens, seq.stopper.context_length)
        cache = self.pool.acquire() if self.pool is not None and longest + SD_MARGIN <= self.pool.capacity else None
        return cache if cache is not None else self.runner.new_cache(capacity=min(seq.total_len + 64, 4096))

    def free_cache(self, seq: Sequence) -> None:
        if seq.cache is not None and self.pool is not None:
            self.pool.release(seq.cache)
        seq.cache = None

    def rebuild_caches(self) -> None:
        """Drop the running requests' KV; the next iteration re-feeds their prefixes (new weights)."""
        for s in self.state.running:
            self.free_cache(s)
            s.cache = self.new_cache(s)

    def retract(self) -> int:
        """Put the running requests back at the head of the queue, in order, without their KV."""
        st = self.state
        back = [s for s in st.running if s.abort_message is None]
        for s in back:
            self.free_cache(s)
            s.retractions += 1
            s.status = SequenceStatus.WAITING
        st.running = [s for s in st.running if s not in back]
        st.waiting.extendleft(reversed(back))
        return len(back)

    def step(self, decoder: SDDecoder, seqs: list[Sequence] | None = None) -> list[Sequence]:
        """One decoder iteration over the running set (or `seqs` of it), outside the lock (`in_step`: nothing else
        changes the set meanwhile). Emits deltas of the unfinished sequences and returns the finished ones, which `reap`
        then retires (a finished request's slot is free before its consumer hears of it)."""
        seqs = [s for s in (self.state.running if seqs is None else seqs) if s.abort_message is None]
        finished = []
        for seq, (ids, lps) in zip(seqs, decoder.decode(self.runner, seqs)):
            if seq.req.params.max_new_tokens == 0 and seq.cache.length == seq.total_len:  # a prompt scored, no more
                seq.finish_reason = {"type": "length", "length": 0}
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

    def reap(self, finished: list[Sequence] = ()) -> None:
        """Retire the finished and the aborted running sequences."""
        done = set(map(id, finished))
        gone = [s for s in self.state.running if id(s) in done or s.abort_message is not None]
        self.state.running = [s for s in self.state.running if s not in gone]
        for s in gone:
            self.finish(s, None if id(s) in done else s.abort_message)

    def finish(self, seq: Sequence, abort_message: str | None = None) -> None:
        """Once out of every set: free its cache and rid, send its last update."""
        seq.status = SequenceStatus.FINISHED
        self.free_cache(seq)
        self.state.rids.discard(seq.req.rid)
        self.emit(seq, abort_message)

    def emit(self, seq: Sequence, abort_message: str | None = None) -> None:
        st, new = self.state, len(seq.output_ids) - seq.sent
        st.generation_tokens_total += new
        st.urgent |= seq.sent == 0 and new > 0
        if abort_message is not None:
            seq.finish_reason = {"type": "abort", "message": abort_message}
        finished = seq.finish_reason is not None
        seq.emit(
            GenerateOutput(
                rid=seq.req.rid,
                new_ids=seq.output_ids[seq.sent :],
                new_logprobs=seq.output_logprobs[seq.sent :],
                finished=finished,
                finish_reason=seq.finish_reason,
                prompt_tokens=len(seq.req.input_ids),
                completion_tokens=len(seq.output_ids),
                weight_version=st.weight_version,
                draft_weight_version=st.draft_weight_version,
                weight_versions=seq.weight_versions(st.weight_version) if finished else None,
                spec_verify_ct=seq.spec_verify_ct,
                spec_accept_token_num=seq.spec_accept_token_num,
                spec_draft_token_num=seq.spec_draft_token_num,
                num_retractions=seq.retractions,
                new_top_logprobs=[top for top, _ in seq.token_extras[seq.sent : len(seq.output_ids)]],
                new_token_ids_logprobs=[ids for _, ids in seq.token_extras[seq.sent : len(seq.output_ids)]],
                prompt_logprobs=seq.prompt_scores.take() if seq.prompt_scores is not None else None,
                spec_accept_token_num_by_source=dict(seq.spec_accept_token_num_by_source) or None,
            )
        )
        seq.sent = len(seq.output_ids)
