"""The SD decode iteration with group drafts: per iteration the source bandit picks an arm (plain, EAGLE-3
chain, group draft, or both as two branches of one tree) and a draft length; every decode-ready
sequence then gets its branches (group first, then EAGLE-3: the fixed verification order) and one
batched target pass verifies all trees (`tree_pass.py`). A sequence without any draft rides in the
same pass as a bare root, i.e. a plain decode step. Prefilling sequences take the plain step, which
still captures hidden states for the drafter. The group index is synced with the running set on
every iteration, SD or not, so siblings' tokens are there when SD switches on; without a drafter
the group source still runs (no hidden states are captured then).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from gleanrl.server.decode import PlainDecoder, feed_counts, forward_fed, sample_next
from gleanrl.server.model_runner import ModelRunner
from gleanrl.server.sampler import params_tensors
from gleanrl.server.sd.decoder import Out, SpecDecoder
from gleanrl.server.sd.draft import draft_tokens
from gleanrl.server.sd.group_drafts import GroupDrafts
from gleanrl.server.sd.source_policy import Arm, SourcePolicy
from gleanrl.server.sd.tree_pass import tree_pass
from gleanrl.server.sequence import Emitted, Sequence


class FusedDecoder(SpecDecoder):
    def __init__(self, plain: PlainDecoder, policy: SourcePolicy, groups: GroupDrafts | None,
                 target_version: Callable[[], str] = lambda: "default", window: int = 256):
        super().__init__(plain, policy, window)
        self.policy: SourcePolicy = policy
        self.groups = groups
        self.target_version = target_version           # the serving weight_version (ages group samples)
        self.accepted_by_source = {"group": 0, "eagle": 0}   # accepted draft tokens (bonus not counted)
        self.passes_by_source = {"group": 0, "eagle": 0}     # verify passes that offered the source

    def stats(self) -> dict:
        by_source = {src: (self.accepted_by_source[src] / n if n else 0.0) for src, n in self.passes_by_source.items()}
        return dict(super().stats(), spec_accepted_tokens_by_source=dict(self.accepted_by_source),
                    avg_spec_accept_length_by_source=by_source,
                    group_index=self.groups.stats() if self.groups else None)

    @torch.inference_mode()
    def decode(self, runner: ModelRunner, seqs: list[Sequence]) -> Emitted:
        if self.policy.config.mode == "off" or (self.drafter is None and self.groups is None):
            return self.plain.decode(runner, seqs)
        if self.groups is not None:
            self.groups.sync(seqs, self.target_version())
        if self.drafter is not None:
            self._sync_states(seqs)
        arm = self.policy.choose(len(seqs), self.drafter is not None)
        ready = [s for s in seqs if s.total_len - s.cache.length == 1] if arm[0] != "plain" else []
        t0 = time.perf_counter()
        out = self._feed_any(runner, [s for s in seqs if s not in set(ready)]) if len(ready) < len(seqs) else {}
        if arm[0] == "plain" and len(out) == len(seqs):
            self.policy.record_arm(len(seqs), arm, len(out), time.perf_counter() - t0)
        if ready:
            t0 = time.perf_counter()
            spec = self._speculate_tree(runner, ready, arm)
            self.policy.record_arm(len(seqs), arm, sum(len(ids) for ids, _ in spec.values()), time.perf_counter() - t0)
            out.update(spec)
        return [out.get(s, ([], [])) for s in seqs]

    def _feed_any(self, runner: ModelRunner, seqs: list[Sequence]) -> Out:
        if self.drafter is not None:
            return self._feed(runner, seqs)
        fed = [(s, c) for s, c in zip(seqs, feed_counts(seqs, self.prefill_chunk)) if c > 0]
        if not fed:
            return {}
        logits, _ = forward_fed(runner, fed)
        rows = [i for i, (s, _) in enumerate(fed) if s.cache.length == s.total_len]
        done = [fed[i][0] for i in rows]
        return dict(zip(done, sample_next(logits[rows], done)))

    def _speculate_tree(self, runner: ModelRunner, seqs: list[Sequence], arm: Arm) -> Out:
        source, k = arm
        prm = params_tensors([s.req.params for s in seqs], runner.device)   # on the target's device
        glen = self.policy.group.group_len if source == "fused" else k
        group = [self._group_draft(s, glen) if source in ("group", "fused") else [] for s in seqs]
        use_eagle = [source in ("eagle", "fused") and self.drafter is not None and self._draft_len(s, k) > 0
                     and self.states[s].pending > 0 for s in seqs]
        eagle: list[list[int]] = [[] for _ in seqs]
        qs: list[torch.Tensor | None] = [None for _ in seqs]
        idx = [b for b, u in enumerate(use_eagle) if u]
        if idx:
            sub = [seqs[b] for b in idx]
            d, q = draft_tokens(self.drafter, sub, [self.states[s] for s in sub], [self._draft_len(s, k) for s in sub],
                                {key: v[idx] for key, v in prm.items()})
            for j, b in enumerate(idx):
                eagle[b], qs[b] = d[j], q[j]
        branches = [[x for x in (g, e) if x] for g, e in zip(group, eagle)]
        srcs = [[name for name, x in (("group", g), ("eagle", e)) if x] for g, e in zip(group, eagle)]
        bq = [[qs[b] if name == "eagle" else None for name in srcs[b]] for b in range(len(seqs))]
        starts = [s.cache.length for s in seqs]
        capture = self.drafter.config.aux_layer_ids if self.drafter is not None else None
        results, aux = tree_pass(runner, seqs, branches, bq, prm, capture)
        out = {}
        for b, (s, r) in enumerate(zip(seqs, results)):
            if self.drafter is not None:
                st = self.states[s]
                if use_eagle[b]:
                    st.cache.truncate(starts[b] - st.start)                  # drop the drafter's own states
                st.add(aux[r.rows])
            if branches[b]:
                self._count(s, srcs[b], r, sum(map(len, branches[b])))
            out[s] = (r.ids, r.logprobs)
        return out

    def _group_draft(self, s: Sequence, length: int) -> list[int]:
        draft = self.groups.propose(s, self._draft_len(s, length)) if self.groups is not None else None
        return draft.tokens if draft is not None else []

    def _count(self, s: Sequence, srcs: list[str], r, proposed: int) -> None:
        s.spec_verify_ct += 1
        s.spec_correct_drafts += r.accepted
        s.spec_proposed_drafts += proposed
        for name in srcs:
            self.passes_by_source[name] += 1
        if r.branch >= 0:
            name = srcs[r.branch]
            self.accepted_by_source[name] += r.accepted
            s.spec_accepted_by_source[name] = s.spec_accepted_by_source.get(name, 0) + r.accepted
        self.verify_ct, self.verify_tokens = self.verify_ct + 1, self.verify_tokens + r.accepted + 1
        self.accept_hist[min(r.accepted + 1, len(self.accept_hist) - 1)] += 1
