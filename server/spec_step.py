"""The speculative decode iteration: the scheduler's `decode_step`, replaced when a drafter is served.

Per sequence: the drafter first consumes the target hidden states it has not seen (EAGLE-3 pairs
h_i with token i+1 at position i); its last row drafts token 1, then k-1 single-token steps feed its own
pre-norm output. One target pass verifies [last token, d_1..d_k] with `capture_layers`; the accepted
prefix plus one corrected/bonus token is emitted, caches are rolled back with `truncate`, and the
target's hidden states of the accepted positions wait for the next catch-up. The scheduler appends the
emitted tokens one at a time and stops at EOS, a stop string or `max_new_tokens` exactly.

Invariant: each sequence's target cache ends one token short of its prefix, and its `DraftState`
holds target hidden states for exactly the positions [next_pos, cache.length). Iterations that do not
speculate (prefill, too many running requests, no room left) still capture hidden states, so switching
SD on costs nothing; a state that breaks the invariant (new drafter, flushed cache) is rebuilt by
re-feeding the target the last `window` tokens. See `server/speculative.py` for the acceptance math.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from gleanrl.server.kv import SeqKVCache
from gleanrl.server.sd.drafter_forward import new_draft_cache
from gleanrl.server.sampler import params_tensors, processed_probs, token_logprobs
from gleanrl.server.scheduler import Emitted, Scheduler, Sequence
from gleanrl.server.sd_policy import SDPolicy
from gleanrl.server.spec_draft import draft_tokens
from gleanrl.server.speculative import verify_greedy, verify_sampled


@dataclass(eq=False)
class DraftState:
    cache: SeqKVCache                 # the drafter's KV for positions [start, next_pos)
    start: int
    chunks: list[torch.Tensor] = field(default_factory=list)  # target aux states [*, 3*Ht] for
    pending: int = 0                  # positions [next_pos, next_pos + pending), not yet fed to the drafter

    @property
    def next_pos(self) -> int:
        return self.start + self.cache.length

    @property
    def covered(self) -> int:
        return self.next_pos + self.pending

    def add(self, rows: torch.Tensor) -> None:
        self.chunks.append(rows)
        self.pending += rows.shape[0]

    def take(self) -> torch.Tensor:
        """All pending states [pending, 3*Ht], in order; the caller feeds them to the drafter."""
        rows = torch.cat(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks, self.pending = [], 0
        return rows


class SpecDecoder:
    def __init__(self, scheduler: Scheduler, policy: SDPolicy, window: int = 256):
        self.scheduler, self.policy, self.window = scheduler, policy, window
        self.plain = scheduler.decode_step
        self.drafter, self.draft_path = None, None
        self.states: dict[Sequence, DraftState] = {}
        self.verify_ct = self.verify_tokens = 0
        self.accept_hist = [0] * 18                 # accept_hist[t]: verify passes that emitted t tokens

    @property
    def avg_accept_length(self) -> float:
        return self.verify_tokens / self.verify_ct if self.verify_ct else 0.0

    def set_drafter(self, drafter, version: str | None) -> None:
        """Between iterations: serve `drafter`; every draft state is rebuilt on the next iteration."""
        self.drafter, self.scheduler.draft_weight_version = drafter, version
        self.states.clear()
        self.policy.reset()

    @torch.inference_mode()
    def decode_step(self, seqs: list[Sequence]) -> Emitted:
        if self.drafter is None or self.policy.config.mode == "off":
            return self.plain(seqs)
        self._sync_states(seqs)
        k = self.policy.choose_k(len(seqs)) if self.policy.use_sd(len(seqs)) else 0
        ks = {s: self._draft_len(s, k) for s in seqs}
        ready = [s for s in seqs if ks[s] > 0 and s.total_len - s.cache.length == 1
                 and self.states[s].pending > 0]
        t0 = time.perf_counter()
        out = self._feed([s for s in seqs if s not in ready]) if len(ready) < len(seqs) else {}
        if k == 0 and self.policy.use_sd(len(seqs)) and len(out) == len(seqs):  # arm 0: a plain decode step
            self.policy.record(len(seqs), 0, len(out), time.perf_counter() - t0)
        if ready:
            t0 = time.perf_counter()
            spec = self._speculate(ready, ks)
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

    def _feed(self, seqs: list[Sequence]) -> dict[Sequence, tuple[list[int], list[float]]]:
        """Plain iteration (prefill chunks or one token) that also captures the target's hidden states."""
        fed, budget = [], self.scheduler.prefill_chunk
        for s in seqs:
            pending = s.total_len - s.cache.length
            count = pending if pending <= 1 else min(pending, max(budget, 0))
            budget -= count
            if count > 0:
                fed.append((s, s.cache.length, count))
        if not fed:
            return {}
        tokens = [t for s, start, c in fed for t in s.tokens(start, start + c)]
        positions = [p for _, start, c in fed for p in range(start, start + c)]
        device = self.scheduler.runner.device
        logits, aux = self.scheduler.runner.forward(
            torch.tensor(tokens, device=device), torch.tensor(positions, device=device), [s.cache for s, _, _ in fed],
            [c for _, _, c in fed],
            capture_layers=self.drafter.config.aux_layer_ids)
        for (s, _, _), rows in zip(fed, aux.split([c for _, _, c in fed])):
            self.states[s].add(rows)
        done = [s for s, _, _ in fed if s.cache.length == s.total_len]
        rows = [i for i, (s, _, _) in enumerate(fed) if s.cache.length == s.total_len]
        return dict(zip(done, Scheduler.sample_rows(logits[rows], done)))

    def _speculate(self, seqs: list[Sequence], ks: dict[Sequence, int]) -> dict[Sequence, tuple[list[int], list[float]]]:
        states = [self.states[s] for s in seqs]
        prm = params_tensors([s.req.params for s in seqs])
        drafts, qs = draft_tokens(self.drafter, seqs, states, [ks[s] for s in seqs], prm)
        starts = [s.cache.length for s in seqs]                                # T - 1: the last token's position
        tokens = [t for s, p0, d in zip(seqs, starts, drafts) for t in s.tokens(p0, p0 + 1) + d]
        positions = [p for p0, d in zip(starts, drafts) for p in range(p0, p0 + len(d) + 1)]
        lens = [len(d) + 1 for d in drafts]
        device = self.scheduler.runner.device
        logits, aux = self.scheduler.runner.forward(
            torch.tensor(tokens, device=device), torch.tensor(positions, device=device), [s.cache for s in seqs], lens,
            capture_layers=self.drafter.config.aux_layer_ids, last_only=False)  # [N, V], [N, 3*Ht]
        out = {}
        for b, (s, st, lg, ax) in enumerate(zip(seqs, states, logits.split(lens), aux.split(lens))):
            d = torch.tensor([drafts[b]], device=lg.device)                   # [1, k]
            pick = {key: v[b].expand(lens[b]) for key, v in prm.items()}
            if pick["temperature"][0] <= 0:
                n_acc, ids = verify_greedy(d, lg.argmax(-1)[None])
            else:
                p = processed_probs(lg, pick["temperature"], pick["top_k"], pick["top_p"], pick["min_p"])
                n_acc, ids = verify_sampled(d, qs[b][None], p[None], [s.generator])
            n = int(n_acc[0])
            ids = ids[0, :n + 1]
            lps = (token_logprobs(lg[:n + 1], ids, pick["temperature"][:n + 1], pick["top_p"][:n + 1]).tolist()
                   if s.req.return_logprob else [0.0] * (n + 1))              # as the plain step: on request
            s.cache.truncate(starts[b] + n + 1)                               # keep [.., d_n]; emit bonus next
            st.cache.truncate(starts[b] - st.start)                           # drop the drafter's own states
            st.add(ax[:n + 1])
            s.spec_verify_ct += 1
            s.spec_accepted += n + 1
            self.verify_ct, self.verify_tokens = self.verify_ct + 1, self.verify_tokens + n + 1
            self.accept_hist[min(n + 1, len(self.accept_hist) - 1)] += 1
            out[s] = (ids.tolist(), lps)
        return out
