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
"""
from __future__ import annotations

import time

import torch

from gleanrl.server.decode import PlainDecoder, feed_counts, forward_fed, sample_rows
from gleanrl.server.model_runner import ModelRunner
from gleanrl.server.sampler import params_tensors, processed_probs, token_logprobs
from gleanrl.server.sd.draft import draft_tokens
from gleanrl.server.sd.draft_state import DraftState
from gleanrl.server.sd.drafter_forward import new_draft_cache
from gleanrl.server.sd.policy import SDPolicy
from gleanrl.server.sd.verify import verify
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
        return dict(zip(done, sample_rows(logits[rows], done)))

    def _speculate(self, runner: ModelRunner, seqs: list[Sequence], ks: list[int]) -> Out:
        states = [self.states[s] for s in seqs]
        prm = params_tensors([s.req.params for s in seqs])
        drafts, qs = draft_tokens(self.drafter, seqs, states, ks, prm)
        starts = [s.cache.length for s in seqs]                                 # T - 1: the last token's position
        tokens = [t for s, p0, d in zip(seqs, starts, drafts) for t in s.tokens(p0, p0 + 1) + d]
        positions = [p for p0, d in zip(starts, drafts) for p in range(p0, p0 + len(d) + 1)]
        lens = [len(d) + 1 for d in drafts]
        device = runner.device
        logits, aux = runner.forward(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                                     [s.cache for s in seqs], lens, capture_layers=self.drafter.config.aux_layer_ids,
                                     last_only=False)                            # [N, V], [N, 3*Ht]
        n_acc, out_ids, offsets = self._verify(logits, seqs, drafts, qs, prm)
        lps = self._logprobs(logits, seqs, n_acc, out_ids, offsets, prm["temperature"])
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

    @staticmethod
    def _verify(logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]], qs: list, prm: dict):
        """All sequences' drafts in one `verify` call, padded to the longest draft K. Returns
        (n_accepted [B], out_ids [B, K+1], each sequence's first row in `logits`)."""
        lens = torch.tensor([len(d) for d in drafts])                          # [B]
        k, device = int(lens.max()), logits.device
        offsets = (torch.cumsum(lens + 1, 0) - (lens + 1)).tolist()
        cols = torch.minimum(torch.arange(k + 1)[None], lens[:, None])         # [B, K+1], padding repeats the last
        rows = (torch.tensor(offsets)[:, None] + cols).to(device)              # [B, K+1] rows of logits
        draft_ids = torch.tensor([d + [0] * (k - len(d)) for d in drafts], device=device)
        greedy = [s.req.params.temperature <= 0 for s in seqs]
        sampled = [b for b, g in enumerate(greedy) if not g]
        p = q = None
        if sampled:
            pick = {key: v[sampled].repeat_interleave(k + 1).to(device) for key, v in prm.items()}
            p = processed_probs(logits[rows[sampled].reshape(-1)], pick["temperature"], pick["top_k"],
                                pick["top_p"], pick["min_p"]).view(len(sampled), k + 1, -1)   # [S, K+1, V]
            q = p.new_zeros(len(sampled), k, p.shape[-1])                                     # [S, K, V]
            for j, b in enumerate(sampled):
                q[j, :len(drafts[b])] = qs[b]
        n_acc, out_ids = verify(draft_ids, logits.argmax(-1)[rows], greedy, lens.to(device), q, p,
                                [seqs[b].generator for b in sampled])
        return n_acc.tolist(), out_ids, offsets

    @staticmethod
    def _logprobs(logits, seqs, n_acc, out_ids, offsets, temperature) -> list[list[float]]:
        """SGLang's logprob of every emitted token, for the sequences that asked (else 0.0, as the plain step)."""
        want = [b for b, s in enumerate(seqs) if s.req.return_logprob]
        lps = [[0.0] * (n + 1) for n in n_acc]
        if want:
            rows = torch.tensor([offsets[b] + j for b in want for j in range(n_acc[b] + 1)], device=logits.device)
            ids = torch.cat([out_ids[b, :n_acc[b] + 1] for b in want])
            temp = torch.cat([temperature[b].expand(n_acc[b] + 1) for b in want]).to(logits.device)
            flat = token_logprobs(logits[rows], ids, temp).tolist()
            for b in want:
                lps[b], flat = flat[:n_acc[b] + 1], flat[n_acc[b] + 1:]
        return lps
