"""The one decoder, `SDDecoder`: a decode iteration, SD or not (plain decoding is an empty draft); `build_decoder`.

Per iteration the controller (`sd/controller.py`) picks per sequence what to verify (nothing, a prefix of its group
draft from `sd/group_index.py`, an EAGLE-3 chain from `sd/draft.py`, or both as two branches, group first) and one
target pass verifies every tree (`sd/tree_pass.py`; a sequence without a draft rides as a bare root). Else the iteration
is the plain step, which with a drafter also captures hidden states, so switching SD on costs nothing; prefilling
sequences always take it. Every iteration is timed into the cost model (all but the drafter call), every verified branch
into the acceptance estimates. Two lanes: a batch with a grammar-constrained sequence is planned, measured and credited
by a controller of its own (`self.constrained`, sharing the cost model): under a grammar a drafter trained on free text
is accepted far less, and free requests must not inherit that, nor it theirs."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from gleanrl.server.config import EngineConfig
from gleanrl.server.decode.iteration import DecodeCounters, PrefillPacer
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.sampling.sampler import params_tensors, sample_next
from gleanrl.server.sampling.sequence import Emitted, Sequence, feed_counts, forward_fed
from gleanrl.server.sd.acceptance import MAX_DEPTH
from gleanrl.server.sd.controller import Controller
from gleanrl.server.sd.cost_model import b_bucket
from gleanrl.server.sd.draft import DraftState, draft_tokens, same_inputs, sync_states
from gleanrl.server.sd.drafter_forward import new_draft_cache
from gleanrl.server.sd.group_index import GroupDraft, GroupDrafts, GroupIndexConfig
from gleanrl.server.sd.plan import Plan
from gleanrl.server.sd.tree_pass import TreeResult, tree_pass
from gleanrl.server.weights.checkpoint import load_for_target

Out = dict[Sequence, tuple[list[int], list[float]]]
IDLE_PROBE = 16


def build_decoder(
    cfg: EngineConfig, runner: ModelRunner, target_config: dict, target_version: Callable[[], str] = lambda: "default"
) -> SDDecoder:
    """`sd="off"`: plain decoding only (a drafter is refused); else the controller chooses among `sd_sources` (eagle:
    the EAGLE-3 chain, once a drafter is served; group: group drafts, `target_version` ages their samples; fused: both
    as two branches). Costs are calibrated when a source can draft, else before the first iteration with a drafter."""
    ctl = Controller(cfg) if cfg.sd != "off" else None  # its settings: EngineConfig's ControllerConfig part
    groups = (
        GroupDrafts(GroupIndexConfig(max_tokens=cfg.group_max_tokens, keep_versions=cfg.group_keep_versions))
        if ctl is not None and "group" in cfg.sd_sources
        else None
    )
    dec = SDDecoder(ctl, groups, target_version, pacer=PrefillPacer(cfg.prefill_share, cfg.chunked_prefill_size))
    if groups is not None or cfg.drafter:  # (EngineConfig refuses a drafter with sd off)
        ctl.calibrate(runner)
    if cfg.drafter:
        dec.set_drafter(load_for_target(cfg.drafter, runner, target_config), cfg.drafter)
    return dec


class SDDecoder:
    def __init__(
        self,
        controller: Controller | None,
        groups: GroupDrafts | None = None,
        target_version: Callable[[], str] = lambda: "default",
        window: int = 256,
        pacer: PrefillPacer | None = None,
    ):
        """controller None: plain decoding only (sd off; no drafter is accepted). pacer: the prompt tokens fed per
        iteration (default: 1024, unpaced)."""
        self.controller, self.groups, self.target_version = controller, groups, target_version
        self.constrained = Controller(controller.config, controller.cost) if controller is not None else None
        self.window, self.pacer = window, pacer or PrefillPacer(1.0, 1024)
        self.drafter, self.draft_path = None, None
        self.states: dict[Sequence, DraftState] = {}
        self.counters = DecodeCounters()
        self.accept_hist = [0] * (MAX_DEPTH + 2)  # accept_hist[t]: verify passes that emitted t tokens
        self.passes_by_source = {"group": 0, "eagle": 0}  # verify passes that offered the source
        self._group_idle: dict[int, int] = {}  # B bucket -> plans in a row that used no group draft
        self._iteration = 0
        self._rebuilt = False  # this iteration rebuilt a drafter cache
        self._decoding, self._prefilled = False, 0  # this iteration: requests decode in it; prompt tokens fed

    def stats(self) -> dict:
        c, accepted = self.counters, self.counters.spec_accept_token_num_by_source
        by_source = {src: accepted[src] / n if n else 0.0 for src, n in self.passes_by_source.items()}
        return {
            "avg_spec_accept_length": c.verify_tokens / c.verify_ct if c.verify_ct else 0.0,
            "spec_accept_histogram": list(self.accept_hist),
            "spec_accept_token_num_by_source": dict(accepted),
            "avg_spec_accept_length_by_source": by_source,
            "group_index": self.groups.index.stats() if self.groups else None,
            "sd_controller": self.controller.summary() if self.controller else None,
            "sd_controller_constrained": self.constrained.summary() if self.constrained else None,
        }

    def set_drafter(self, drafter, path: str | None) -> None:
        """Between iterations: serve `drafter`. A drafter reading the same target layers keeps the target's states (each
        drafter cache rebuilt from them at its next catch-up, no target forward); otherwise states are rebuilt by
        re-feeding the target the last `window` tokens (`sd/draft.py`). Acceptance estimates stay, as a prior."""
        if self.controller is None:
            raise ValueError("plain decoding (sd off) serves no drafter")
        old, self.drafter, self.draft_path = self.drafter, drafter, path
        if drafter is not None and old is not None and same_inputs(old, drafter):
            self.states = {s: st.rebased(new_draft_cache(drafter)) for s, st in self.states.items()}
        else:
            self.states.clear()
        self.controller.drafter_swapped()
        self.constrained.drafter_swapped()
        if drafter is not None:
            self.controller.cost.calibrate_drafter(drafter)

    def decode(self, runner: ModelRunner, seqs: list[Sequence]) -> Emitted:
        t0, f0 = time.perf_counter(), runner.forward_seconds
        self._prefilled = 0  # prompt tokens fed (`_feed`)
        try:
            return self._decode(runner, seqs)
        finally:
            seconds = time.perf_counter() - t0
            self.counters.iterations += 1
            self.counters.iteration_s += seconds
            self.counters.forward_s += runner.forward_seconds - f0
            self.pacer.record(self._decoding, self._prefilled, seconds)

    @torch.inference_mode()
    def _decode(self, runner: ModelRunner, seqs: list[Sequence]) -> Emitted:
        if self.drafter is not None and not self.controller.cost.target:
            self.controller.calibrate(runner)  # a first drafter hot-swapped in
        t0 = time.perf_counter()  # the whole iteration is the plan's cost
        if self.groups is not None:
            self.groups.sync(seqs, self.target_version())
        if self.drafter is not None:
            self.states = sync_states(self.states, seqs, self.drafter, self.window)
        ready = [s for s in seqs if s.total_len - s.cache.length == 1 and not s.scoring]
        self._decoding = bool(ready)
        ctl = self._lane(seqs)
        plan, proposals = self._plan(ctl, ready) if ready and ctl is not None else (None, [])
        if plan is None or not plan.drafts:
            out = self._feed(runner, seqs)
            if ctl is not None and len(ready) == len(seqs):
                ctl.record_plain(len(seqs), time.perf_counter() - t0)
            self._count_pass(ready, len(ready))
            return [out.get(s, ([], [])) for s in seqs]
        waiting = set(seqs) - set(ready)
        out = self._feed(runner, [s for s in seqs if s in waiting]) if waiting else {}
        spec, rows, draft_s, chains = self._speculate(ctl, runner, ready, plan, proposals)
        tokens = sum(len(ids) for ids, _ in spec.values())
        if not waiting:
            seconds = time.perf_counter() - t0
            ctl.cost.record_pass(len(seqs), rows / len(seqs), seconds - draft_s)
            if not self._rebuilt:  # a swap's one-off rebuild is no cell's cost
                ctl.record_iteration(len(seqs), plan, tokens, seconds, *chains)
        self._count_pass(ready, tokens)
        out.update(spec)
        return [out.get(s, ([], [])) for s in seqs]

    def _count_pass(self, ready: list[Sequence], tokens: int) -> None:
        if ready:
            self.counters.decode_passes += 1
            self.counters.decode_rows += len(ready)
            self.counters.decode_tokens += tokens

    def _lane(self, seqs: list[Sequence]) -> Controller | None:
        """The controller of this batch: the constrained lane's when any sequence has a grammar."""
        if self.controller is not None and any(s.req.params.grammar is not None for s in seqs):
            return self.constrained
        return self.controller

    def _plan(self, ctl: Controller, seqs: list[Sequence]) -> tuple[Plan, list[GroupDraft | None]]:
        cfg = ctl.config
        propose = (
            self.groups is not None
            and "group" in cfg.sd_sources
            and (cfg.sd == "on" or len(seqs) <= cfg.group_max_batch)
            and self._probe(len(seqs))
        )
        if not propose and cfg.sd != "on" and ctl.still_quiet(len(seqs)):
            return Plan([0] * len(seqs), [0] * len(seqs), 0.0, 0.0), []  # nothing to plan
        caps = [self._cap(s) for s in seqs]
        proposals = [self.groups.propose(s, c) if propose and c > 0 else None for s, c in zip(seqs, caps)]
        eagle_ok = [self.drafter is not None and c > 0 and self.states[s].pending > 0 for s, c in zip(seqs, caps)]
        ctl.accept.keep_only(seqs)
        plan = ctl.plan(caps, [d.probs if d is not None else [] for d in proposals], eagle_ok, seqs)
        if propose:
            bucket = b_bucket(len(seqs))
            self._group_idle[bucket] = 0 if any(plan.group_lens) else self._group_idle.get(bucket, 0) + 1
        return plan, proposals

    def _probe(self, b: int) -> bool:
        """Propose group drafts now? Proposing costs Python time: in a bucket whose last IDLE_PROBE plans used none,
        only every IDLE_PROBE-th iteration proposes."""
        self._iteration += 1
        return self._group_idle.get(b_bucket(b), 0) < IDLE_PROBE or self._iteration % IDLE_PROBE == 0

    @staticmethod
    def _cap(s: Sequence) -> int:
        """Emitting n+1 tokens must fit both max_new_tokens and the context length."""
        left = s.req.params.max_new_tokens - len(s.output_ids)
        return max(0, min(MAX_DEPTH, left - 1, s.stopper.context_length - s.total_len - 1))

    def _feed(self, runner: ModelRunner, seqs: list[Sequence]) -> Out:
        """The plain step (prefill chunks or one token), capturing hidden states for a drafter."""
        fed = [(s, c) for s, c in zip(seqs, feed_counts(seqs, *self.pacer.budget(self._decoding))) if c > 0]
        if not fed:
            return {}
        self._prefilled = sum(c for s, c in fed if s.total_len - s.cache.length > 1 or s.scoring)
        capture = self.drafter.config.aux_layer_ids if self.drafter is not None else None
        logits, aux = forward_fed(runner, fed, capture_layers=capture)
        if aux is not None:
            for (s, _), rows in zip(fed, aux.split([c for _, c in fed])):
                self.states[s].add(rows)
        # a prompt scored with max_new_tokens 0 samples nothing (the scheduler finishes it)
        rows = [i for i, (s, _) in enumerate(fed) if s.cache.length == s.total_len and s.req.params.max_new_tokens]
        done = [fed[i][0] for i in rows]
        return dict(zip(done, sample_next(logits[rows], done)))

    def _speculate(
        self, ctl: Controller, runner: ModelRunner, seqs: list[Sequence], plan: Plan, proposals: list[GroupDraft | None]
    ) -> tuple[Out, int, float, tuple[int, int]]:
        """Drafts, verifies; returns (outputs, pass rows, draft seconds, (EAGLE-3 chains tested, accepted tokens))."""
        prm = params_tensors([s.req.params for s in seqs], runner.device)  # on the target's device
        draft_s, self._rebuilt = 0.0, False
        eagle: list[list[int]] = [[] for _ in seqs]
        qs: list[torch.Tensor | None] = [None for _ in seqs]
        idx = [b for b, n in enumerate(plan.eagle_lens) if n]
        starts = [s.cache.length for s in seqs]
        if idx:
            sub, ks = [seqs[b] for b in idx], [plan.eagle_lens[b] for b in idx]
            catch_up = max(self.states[s].pending for s in sub)
            self._rebuilt = any(self.states[s].rebuilt for s in sub)
            for s in sub:
                self.states[s].rebuilt = False
            t0 = time.perf_counter()
            d, q = draft_tokens(
                self.drafter, sub, [self.states[s] for s in sub], ks, {key: v[idx] for key, v in prm.items()}
            )
            draft_s = time.perf_counter() - t0
            self.counters.drafter_s += draft_s
            if catch_up <= 8:  # a long catch-up (after plain steps) is no step cost
                ctl.cost.record_draft(len(sub), max(ks), draft_s)
            for j, b in enumerate(idx):
                eagle[b], qs[b] = d[j], q[j]
        group = [p.tokens[:n] if p is not None else [] for p, n in zip(proposals, plan.group_lens)]
        srcs = [[name for name, x in (("group", g), ("eagle", e)) if x] for g, e in zip(group, eagle)]
        branches = [[x for x in (g, e) if x] for g, e in zip(group, eagle)]
        bq = [[qs[b] if name == "eagle" else None for name in srcs[b]] for b in range(len(seqs))]
        capture = self.drafter.config.aux_layer_ids if self.drafter is not None else None
        results, aux = tree_pass(runner, seqs, branches, bq, prm, capture)
        out, chains = {}, [0, 0]
        for b, (s, r) in enumerate(zip(seqs, results)):
            if self.drafter is not None:
                st = self.states[s]
                if eagle[b]:
                    st.cache.truncate(starts[b] - st.start)  # drop the drafter's own states
                st.add(aux[r.rows])
            if branches[b]:
                self._count(ctl, s, srcs[b], branches[b], proposals[b], r)
            if eagle[b] and (r.branch < 0 or srcs[b].index("eagle") <= r.branch):
                chains[0] += 1  # the chain was tested
                chains[1] += r.accepted if srcs[b][max(r.branch, 0)] == "eagle" else 0
            out[s] = (r.ids, r.logprobs)
        return out, sum(1 + sum(map(len, br)) for br in branches), draft_s, tuple(chains)

    def _count(
        self,
        ctl: Controller,
        s: Sequence,
        srcs: list[str],
        branches: list[list[int]],
        proposal: GroupDraft | None,
        r: TreeResult,
    ) -> None:
        """Statistics and acceptance estimates: a branch the walk tested (the first, and the next ones while the earlier
        were rejected at the root) counts its accepted prefix."""
        s.spec_verify_ct += 1
        s.spec_accept_token_num += r.accepted
        s.spec_draft_token_num += sum(map(len, branches))
        for m, (name, br) in enumerate(zip(srcs, branches)):
            self.passes_by_source[name] += 1
            if r.branch < 0 or m <= r.branch:
                accepted = r.accepted if m == r.branch else 0
                ctl.accept.record(
                    name, len(br), accepted, proposal.probs if name == "group" and proposal else None, key=s
                )
        if r.branch >= 0:
            name = srcs[r.branch]
            self.counters.spec_accept_token_num_by_source[name] += r.accepted
            s.spec_accept_token_num_by_source[name] = s.spec_accept_token_num_by_source.get(name, 0) + r.accepted
        self.counters.verify_ct += 1
        self.counters.verify_tokens += r.accepted + 1
        self.accept_hist[min(r.accepted + 1, len(self.accept_hist) - 1)] += 1
