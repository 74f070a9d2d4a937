"""The speculative decode iteration: `SpecDecoder.decode`, a drop-in for `PlainDecoder.decode`.

Per iteration: the policy picks the draft length k for the batch; sequences that can speculate (one token
pending, hidden states ready, room left) get up to k drafted tokens (`draft.py`), one target pass scores
[last token, d_1..d_k] of all of them with `capture_layers`, and one batched `verify` call accepts a
prefix plus one corrected/bonus token per sequence. Caches are rolled back with `truncate`; the target's
hidden states of the accepted positions wait in the `DraftState` for the next catch-up. The others
(prefill chunks, SD off for this batch size) take a plain step that still captures hidden states, so
switching SD on costs nothing. A state that breaks its invariant (new drafter, flushed or retracted
cache) is rebuilt by re-feeding the target the last `window` tokens. The scheduler appends the emitted
tokens one at a time and stops at EOS, a stop string or `max_new_tokens` exactly.

Penalties, min_new_tokens and logit_bias apply at each verify position with the counts of the output plus
the drafts before it (`sampler.penalised`): drafts are verified against exactly the distribution plain
decoding would use there, so SD stays lossless; the drafter's q stays unpenalised, which costs acceptance
only. SGLang instead repeats one penalty row over the window (`orchestrator.apply(repeat=...)`).
"""
from __future__ import annotations

import time

import torch

from gleanrl.server.decode import PlainDecoder, feed_counts, forward_fed, sample_next
from gleanrl.server.model_runner import ModelRunner
from gleanrl.server.sampler import params_tensors, penalised
from gleanrl.server.sd.draft import draft_tokens
from gleanrl.server.sd.draft_state import DraftState
from gleanrl.server.sd.drafter_forward import new_draft_cache
from gleanrl.server.sd.policy import SDPolicy
from gleanrl.server.sd.verify_batch import emitted_extras, emitted_logprobs, verify_batch
from gleanrl.server.sequence import Emitted, Sequence

Out = dict[Sequence, tuple[list[int], list[float]]]


class SpecDecoder:
    def __init__(self, plain: PlainDecoder, policy: SDPolicy, window: int = 256):
        self.plain, self.policy, self.window = plain, policy, window
        self.prefill_chunk = plain.prefill_chunk
        self.drafter, self.draft_path = None, None
        self.states: dict[Sequence, DraftState] = {}
        self.verify_ct = self.verify_tokens = 0
        self.accept_hist = [0] * 18                 # accept_hist[t]: verify passes that emitted t tokens

    def stats(self) -> dict:
        return {"avg_spec_accept_length": self.verify_tokens / self.verify_ct if self.verify_ct else 0.0,
                "spec_accept_histogram": list(self.accept_hist)}

    def set_drafter(self, drafter, path: str | None) -> None:
        """Between iterations: serve `drafter`; every draft state is rebuilt on the next iteration and
        the policy's measurements, made with the old drafter, count less (`SDPolicy.decay`)."""
        self.drafter, self.draft_path = drafter, path
        self.states.clear()
        self.policy.decay()

    @torch.inference_mode()
    def decode(self, runner: ModelRunner, seqs: list[Sequence]) -> Emitted:
        if self.drafter is None or self.policy.config.mode == "off":
            return self.plain.decode(runner, seqs)
        self._sync_states(seqs)
        use_sd = self.policy.use_sd(len(seqs))
        k = self.policy.choose_k(len(seqs)) if use_sd else 0
        ks = {s: self._draft_len(s, k) for s in seqs}
        ready = [s for s in seqs if ks[s] > 0 and s.total_len - s.cache.length == 1 and self.states[s].pending > 0]
        t0 = time.perf_counter()
        out = self._feed(runner, [s for s in seqs if s not in ready]) if len(ready) < len(seqs) else {}
        if k == 0 and use_sd and len(out) == len(seqs):  # arm 0: a plain decode step
            self.policy.record(len(seqs), 0, len(out), time.perf_counter() - t0)
        if ready:
            t0 = time.perf_counter()
            spec = self._speculate(runner, ready, [ks[s] for s in ready])
            self.policy.record(len(seqs), k, sum(len(ids) for ids, _ in spec.values()), time.perf_counter() - t0)
            out.update(spec)
        return [out.get(s, ([], [])) for s in seqs]

    def _sync_states(self, seqs: list[Sequence]) -> None:
        self.states = {s: self.states[s] for s in seqs if s in self.states}
        for s in seqs:
            st, length = self.states.get(s), s.cache.length
            if st is None or st.covered != length:      # re-feed a recent window to capture its states
                s.cache.truncate(max(length - self.window, 0))
                self.states[s] = self._new_state(s.cache.length)
            elif st.pending > self.window + 64:          # a long stretch without SD: keep a recent window
                self.states[s] = self._new_state(st.covered - self.window)
                self.states[s].add(st.take()[-self.window:])

    def _new_state(self, start: int) -> DraftState:
        return DraftState(new_draft_cache(self.drafter), start)

    @staticmethod
    def _draft_len(s: Sequence, k: int) -> int:
        """Emitting n+1 <= k+1 tokens must fit both max_new_tokens and the context length."""
        left = s.req.params.max_new_tokens - len(s.output_ids)
        return max(0, min(k, left - 1, s.stopper.context_length - s.total_len - 1))

    def _feed(self, runner: ModelRunner, seqs: list[Sequence]) -> Out:
        """Plain iteration (prefill chunks or one token) that also captures the target's hidden states."""
        fed = [(s, c) for s, c in zip(seqs, feed_counts(seqs, self.prefill_chunk)) if c > 0]
        if not fed:
            return {}
        logits, aux = forward_fed(runner, fed, capture_layers=self.drafter.config.aux_layer_ids)
        for (s, _), rows in zip(fed, aux.split([c for _, c in fed])):
            self.states[s].add(rows)
        rows = [i for i, (s, _) in enumerate(fed) if s.cache.length == s.total_len]
        done = [fed[i][0] for i in rows]
        return dict(zip(done, sample_next(logits[rows], done)))

    def _speculate(self, runner: ModelRunner, seqs: list[Sequence], ks: list[int]) -> Out:
        states = [self.states[s] for s in seqs]
        prm = params_tensors([s.req.params for s in seqs], runner.device)  # drafts and verify on the target's device
        drafts, qs = draft_tokens(self.drafter, seqs, states, ks, prm)
        starts = [s.cache.length for s in seqs]                                 # T - 1: the last token's position
        tokens = [t for s, p0, d in zip(seqs, starts, drafts) for t in s.tokens(p0, p0 + 1) + d]
        positions = [p for p0, d in zip(starts, drafts) for p in range(p0, p0 + len(d) + 1)]
        lens = [len(d) + 1 for d in drafts]
        device = runner.device
        logits, aux = runner.forward(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                                     [s.cache for s in seqs], lens, capture_layers=self.drafter.config.aux_layer_ids,
                                     last_only=False)                            # [N, V], [N, 3*Ht]
        logits = penalised(logits, seqs, drafts)  # window row j counts d_1..d_j: verify against the penalised p
        n_acc, out_ids, offsets = verify_batch(logits, seqs, drafts, qs, prm)
        lps = emitted_logprobs(logits, seqs, n_acc, out_ids, offsets, prm["temperature"])
        emitted_extras(logits, seqs, n_acc, offsets, prm["temperature"])
        out = {}
        for b, (s, st) in enumerate(zip(seqs, states)):
            n, o = int(n_acc[b]), offsets[b]
            s.cache.truncate(starts[b] + n + 1)                                # keep [.., d_n]; emit bonus next
            st.cache.truncate(starts[b] - st.start)                            # drop the drafter's own states
            st.add(aux[o:o + n + 1])
            s.spec_verify_ct += 1
            s.spec_correct_drafts += n
            s.spec_proposed_drafts += len(drafts[b])
            self.verify_ct, self.verify_tokens = self.verify_ct + 1, self.verify_tokens + n + 1
            self.accept_hist[min(n + 1, len(self.accept_hist) - 1)] += 1
            out[s] = (out_ids[b, :n + 1].tolist(), lps[b])
        return out
