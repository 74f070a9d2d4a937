"""The cost-model controller: plain decoding where drafting does not pay, per-sequence drafts where
it does, estimates kept across drafter swaps, and, in a simulated engine with known costs and
acceptances, a realised rate never below plain decoding's (tokens per second of simulated time, no
wall clock)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gleanrl.server.config import ControllerConfig
from gleanrl.server.sd import controller as ctl_mod
from gleanrl.server.sd.acceptance import expected_accepted
from gleanrl.server.sd.cells import BUDGET, MIN_SAMPLES, PAY, REPROBE
from gleanrl.server.sd.controller import EXPLORE, PROBE, QUIET_MAX, Controller
from gleanrl.server.sd.cost_model import T_GRID, CostModel
from gleanrl.server.sd.plan import EXPLORE_DEPTHS

ALL = ("eagle", "group", "fused")
EVERY = ControllerConfig(sd_sources=ALL, sd_max_batch=64)  # every source, at any batch up to 64


def _costs(ctl: Controller, batches, per_token: float, base: float = 0.01) -> None:
    """A target pass of B sequences x T tokens costs base * B^0.3 * (1 + per_token *
    (B * T - 1))."""
    for b in batches:
        for t in (1, 4, 16, 33):
            ctl.cost.record_pass(b, t, base * b**0.3 * (1 + per_token * (b * t - 1)))
        ctl.cost.step[b] = 0.1 * base * b**0.3


def test_expected_accepted_is_the_sum_of_prefix_products():
    assert expected_accepted(np.array([0.5, 0.5, 1.0])).tolist() == [0.0, 0.5, 0.75, 1.0]


def test_cost_model_interpolates_and_extrapolates_pessimistically():
    cost = CostModel()
    cost.record_pass(4, 1, 1.0)
    cost.record_pass(4, 4, 2.0)
    est = dict(zip(T_GRID, cost.pass_seconds(3)))  # same bucket (4)
    assert est[1] == 1.0 and est[2] == pytest.approx(4 / 3) and est[8] == pytest.approx(4.0)
    assert np.isnan(CostModel().pass_seconds(1)).all()


def test_plain_where_verifying_is_expensive_drafts_where_it_is_cheap():
    probs = [[0.97] * 20] * 4
    cheap, dear = Controller(EVERY), Controller(EVERY)
    _costs(cheap, (4,), per_token=0.01)
    _costs(dear, (4,), per_token=2.0)
    plan = cheap.plan([20] * 4, probs, [False] * 4)
    assert plan.drafts and all(n > 4 for n in plan.group_lens) and plan.expected_rate > plan.plain_rate
    assert not dear.plan([20] * 4, probs, [False] * 4).drafts


def test_drafts_are_chosen_per_sequence():
    ctl = Controller(EVERY)
    _costs(ctl, (4,), per_token=0.02)
    plan = ctl.plan([20, 20, 0, 20], [[0.97] * 12, [], [0.97] * 12, [0.3, 0.3]], [False] * 4)
    # no draft / no room
    assert plan.group_lens[0] > 0 and plan.group_lens[1] == 0 and plan.group_lens[2] == 0
    assert plan.group_lens[3] <= 2


def test_eagle_acceptance_is_measured_and_kept_across_a_swap():
    """No optimistic prior: an unmeasured drafter is not drafted with; measured good, it is; a swap
    keeps the evidence as a prior that weighs half."""
    ctl = Controller(ControllerConfig(sd_max_batch=64))
    _costs(ctl, (1,), per_token=0.02)
    assert not ctl.plan([20], [[]], [True]).drafts  # unknown: not worth it
    for _ in range(40):
        ctl.accept.record("eagle", 4, 4)  # a good drafter
    assert ctl.plan([20], [[]], [True]).eagle_lens[0] > 0
    for _ in range(400):
        ctl.accept.record("eagle", 4, 0)  # the drafter is useless
    assert not ctl.plan([20], [[]], [True]).drafts
    before = ctl.accept.eagle.tries[0]
    ctl.drafter_swapped()
    assert ctl.accept.eagle.tries[0] == pytest.approx(before / 2)  # kept, weighing less
    assert not ctl.plan([20], [[]], [True]).drafts


def test_each_sequence_gets_its_own_draft_length_or_none():
    """Two sequences in one batch: the one whose drafts are accepted drafts long, the one whose
    drafts are rejected drafts nothing, in the same plan."""
    ctl = Controller(ControllerConfig(sd_max_batch=64))
    _costs(ctl, (2,), per_token=0.05)
    good, bad = object(), object()
    for _ in range(30):
        ctl.accept.record("eagle", 6, 6, key=good)
        ctl.accept.record("eagle", 6, 0, key=bad)
    plan = ctl.plan([20, 20], [[], []], [True, True], [good, bad])
    assert plan.eagle_lens[0] >= 4 and plan.eagle_lens[1] == 0
    assert plan.expected_rate > plan.plain_rate


def test_unmeasured_drafting_is_explored_rarely_and_a_losing_cell_is_refused():
    """With nothing measured the controller plays plain but explores a drafting plan once every
    EXPLORE plans; a cell whose realised rate lost to plain is refused afterwards even though its
    estimates say it pays, but for a re-try every REPROBE-th refusal once its probe credit is
    earned back (here by plain iterations, as the decoder records them)."""
    ctl = Controller(ControllerConfig(sd_max_batch=64))
    _costs(ctl, (1,), per_token=0.02)
    plans = [ctl.plan([20], [[]], [True]) for _ in range(EXPLORE)]
    assert [p.drafts for p in plans] == [False] * (EXPLORE - 1) + [True]
    for _ in range(40):
        ctl.accept.record("eagle", 4, 4)  # estimates: SD pays
    plan = ctl.plan([20], [[]], [True])
    assert plan.drafts
    for _ in range(MIN_SAMPLES):  # ... but it measured 0.8x
        ctl.record_iteration(1, plan, 1, 1.25 / plan.plain_rate)
    losing, played = ctl.cells.key(1, plan), []
    n = 2 * REPROBE * QUIET_MAX
    for _ in range(n):
        p = ctl.plan([20], [[]], [True])
        if p.drafts:
            played.append(ctl.cells.key(1, p))
            ctl.record_iteration(1, p, 1, 1.25 / p.plain_rate)
        else:
            ctl.record_plain(1, 1 / plan.plain_rate)
    assert 1 <= played.count(losing) <= n // (REPROBE * EXPLORE)  # one retry per REPROBE looks


def test_fixed_length_in_mode_on_is_deterministic():
    ctl = Controller(ControllerConfig(sd="on", num_draft_tokens=3, sd_sources=ALL))
    plan = ctl.plan([20, 2, 20], [[0.9] * 8, [0.9] * 8, []], [True, True, False])
    assert plan.eagle_lens == [3, 2, 0] and plan.group_lens == [3, 2, 0]


def _simulate(
    ctl: Controller, true: Controller, b: int, alpha: float, iterations: int, rng: random.Random
) -> tuple[float, int]:
    """A simulated engine: true pass and drafter costs `true`'s, true conditional acceptance
    `alpha` for every draft token (EAGLE-3 and group alike); the controller learns acceptance from
    the verified branches and costs from every iteration, as the decoder records them. Returns
    (realised tokens per simulated second over plain's, drafting iterations)."""
    tokens = seconds = 0.0
    drafted = 0
    for _ in range(iterations):
        probs = [[0.9] * 16 for _ in range(b)]
        plan = ctl.plan([30] * b, probs, [True] * b)
        t = 1 + max(g + e for g, e in zip(plan.group_lens, plan.eagle_lens))
        secs = true.cost.pass_seconds(b)[T_GRID.index(min(x for x in T_GRID if x >= t))]
        secs += true.cost.draft_seconds(b, max(plan.eagle_lens)) if any(plan.eagle_lens) else 0.0
        emitted, chains = 0, [0, 0]
        for g, e in zip(plan.group_lens, plan.eagle_lens):
            accepted = 0
            for src, n in (("group", g), ("eagle", e)):
                if n == 0:
                    continue
                acc = next((j for j in range(n) if rng.random() >= alpha), n)
                ctl.accept.record(src, n, acc, [0.9] * n if src == "group" else None)
                if src == "eagle":
                    chains[0], chains[1] = chains[0] + 1, chains[1] + acc
                accepted = acc
                if acc > 0:
                    break
            emitted += 1 + accepted
        if plan.drafts:
            drafted += 1
            ctl.record_iteration(b, plan, emitted, secs, *chains)
        else:
            ctl.record_plain(b, secs)
        tokens, seconds = tokens + emitted, seconds + secs
    return tokens / seconds / (b / true.cost.pass_seconds(b)[0]), drafted


@pytest.mark.parametrize("alpha,per_token", [(0.9, 0.01), (0.6, 0.05), (0.3, 0.2), (0.1, 0.5)])
def test_simulated_rate_is_never_below_plain(alpha, per_token):
    """Realised tokens per simulated second stays >= plain decoding's (0.97 slack for the
    learning), and where drafting pays the controller drafts."""
    ctl, true, b = Controller(EVERY), Controller(EVERY), 8
    _costs(ctl, (b,), per_token)
    _costs(true, (b,), per_token)
    ratio, _ = _simulate(ctl, true, b, alpha, 400, random.Random(0))
    assert ratio >= 0.97
    if alpha == 0.9:
        assert ratio > 2.0


def test_a_drafter_that_costs_more_than_estimated_loses_at_most_the_probe_budget():
    """One thread: the drafter's true step costs as much as a target pass (estimated at a tenth),
    so drafting loses whatever the acceptance, though the estimates say it pays. Probes are paid
    from the credit: over many iterations the realised rate stays within about BUDGET of plain,
    and only a few iterations draft."""
    ctl, true, b = Controller(ControllerConfig(sd_max_batch=64)), Controller(), 1
    _costs(ctl, (b,), per_token=0.02)
    _costs(true, (b,), per_token=0.02)
    true.cost.step[b] = true.cost.target[b][1]
    for _ in range(40):
        ctl.accept.record("eagle", 4, 3)  # a drafter that looks good
    ratio, drafted = _simulate(ctl, true, b, 0.5, 4000, random.Random(1))
    assert ratio >= 1 - 2 * BUDGET
    assert drafted <= 4000 * 2 * BUDGET


class _FirstDraftRejected(random.Random):
    """The first draw rejects (a draft token's uniform of 0.99), the rest are random."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.first = True

    def random(self) -> float:
        if self.first:
            self.first = False
            return 0.99
        return super().random()


def test_one_unlucky_first_probe_does_not_shut_a_paying_bucket_off():
    """A fresh bucket's first probes come from an allowance of CAP plain iterations, not only from
    the BUDGET share: a first draft that is rejected (a loss of about a plain iteration, which the
    share alone repays only after ~1 / BUDGET iterations) is followed by more probes at once, and a
    drafter that pays (acceptance 0.8, cheap verify) is found within a short request."""
    ctl, true = Controller(ControllerConfig(sd_max_batch=64)), Controller()
    _costs(ctl, (1,), per_token=0.02)
    _costs(true, (1,), per_token=0.02)
    ratio, drafted = _simulate(ctl, true, 1, 0.8, 100, _FirstDraftRejected(0))
    assert ctl.accept.eagle.tries[0] >= 2 and drafted >= 30 and ratio > 1.2


def test_a_look_tries_a_chain_several_depths_past_the_measured_ones_a_measured_plan_one():
    """Where each verify row costs a good share of a plain pass (the 32-layer policy at 1 running: 2 rows ~1.4x one),
    a one-token chain barely pays, so a first probe of one token taught little and one rejection kept buckets 1-2
    plain for whole `bench sd` runs (2026-12-07). A look may try up to EXPLORE_DEPTHS unmeasured depths at once; plans
    by the measured estimates still grow one depth at a time."""
    ctl = Controller(ControllerConfig())
    _costs(ctl, (1,), per_token=0.1)
    plans = [ctl.plan([20], [[]], [True]) for _ in range(EXPLORE)]
    assert not any(p.drafts for p in plans[:-1]) and 1 < max(plans[-1].eagle_lens) <= EXPLORE_DEPTHS
    for _ in range(40):
        ctl.accept.record("eagle", 1, 1)  # depth 1 measured and always accepted, nothing deeper
    plan = ctl.plan([20], [[]], [True])
    assert plan.drafts and max(plan.eagle_lens) == 2  # one past the measured depth


def test_a_quiet_bucket_plays_plain_without_planning(monkeypatch):
    """Where SD measured to lose and no probe is affordable, plain plays without the planning work
    (no plan search), and looks stay at most one per EXPLORE plans, sparser as they find nothing."""
    ctl = Controller(ControllerConfig(sd_max_batch=64))
    _costs(ctl, (1,), per_token=0.02)
    searches, plain = [], ctl.cost.target[1][1]
    best = ctl_mod.best_plan
    monkeypatch.setattr(ctl_mod, "best_plan", lambda *a, **k: searches.append(1) or best(*a, **k))
    drafted = 0
    for _ in range(1000):
        plan = ctl.plan([20], [[]], [True])
        if plan.drafts:  # an exploration, which loses (0.5x)
            drafted += 1
            ctl.record_iteration(1, plan, 1, 2 * plain, 1, 0)
        else:
            ctl.record_plain(1, plain)
    assert 1 <= drafted <= 1000 * BUDGET + 1
    assert len(searches) <= 2 * 1000 // EXPLORE
    late = len(searches)
    for _ in range(1000):
        assert not ctl.plan([20], [[]], [True]).drafts
        ctl.record_plain(1, plain)
    assert len(searches) - late <= 2 * 1000 // QUIET_MAX + 2


def test_a_collapsed_drafter_is_dropped_for_its_bucket_until_re_measured():
    """A cell measured to pay plays; the drafter's realised acceptance then collapses (a bad push):
    at once the bucket stops drafting but for credit-paid probes, and a probe that measures the
    acceptance back above the floor re-admits it."""
    ctl = Controller(ControllerConfig(sd_max_batch=64))
    _costs(ctl, (1,), per_token=0.02)
    for _ in range(40):
        ctl.accept.record("eagle", 4, 4)
    plan = ctl.plan([20], [[]], [True])
    assert plan.drafts
    for _ in range(MIN_SAMPLES):  # it pays: 2x plain
        ctl.record_iteration(1, plan, 1 + 4, 2.5 / plan.plain_rate, 1, 4)
    key = ctl.cells.key(1, plan)
    assert ctl.cells.pays(key) and ctl.accept_floor(1) > 0
    # the collapse: chains accept nothing; a few iterations on, the drafter is dropped, while the
    # cell's realised speed (an EMA of whole iterations) still says it pays
    for _ in range(6):
        ctl.record_iteration(1, plan, 1, 1.2 / plan.plain_rate, 1, 0)
    assert 1 in ctl.cells.dropped and ctl.cells.cells[key][1] > PAY
    assert not ctl.cells.pays(key)
    drafted, plain = 0, ctl.cost.target[1][1]
    for _ in range(500):
        p = ctl.plan([20], [[]], [True])
        if p.drafts:  # a probe: the drafter still collapsed
            drafted += 1
            ctl.record_iteration(1, p, 1, 1.2 * plain, 1, 0)
        else:
            ctl.record_plain(1, plain)
    assert drafted <= 500 * 2 * BUDGET + 1 and 1 in ctl.cells.dropped
    for _ in range(5):  # the drafter recovered: a probe re-admits it
        ctl.cells.record_acceptance(1, 1, 4, ctl.accept_floor(1))
    assert 1 not in ctl.cells.dropped


def test_a_bucket_measured_only_plain_follows_a_calibrated_curve():
    """Online plain passes give a new bucket its T = 1 cell only; its SD cells follow the nearest
    calibrated bucket's shape (not T times plain), so SD can still be chosen there."""
    cost = CostModel()
    for t in (1, 4, 16, 33):
        cost.record_pass(8, t, 1.0 + 0.05 * (t - 1))
    cost.record_pass(16, 1, 2.0)
    est = dict(zip(T_GRID, cost.pass_seconds(16)))
    assert est[1] == 2.0 and est[4] == pytest.approx(2.0 * 1.15) and est[33] == pytest.approx(2.0 * 2.6)


def test_real_iterations_replace_and_rescale_calibrated_cells():
    cost = CostModel()
    for t in (1, 4, 16):
        cost.record_pass(8, t, 1.0 + 0.1 * (t - 1), calibrating=True)
    # overheads: 3x the bare forward
    cost.record_pass(8, 1, 3.0)
    est = dict(zip(T_GRID, cost.pass_seconds(8)))
    assert est[1] == 3.0 and est[4] == pytest.approx(3.0 * 1.3) and est[16] == pytest.approx(3.0 * 2.5)
    # the first real tree pass replaces
    cost.record_pass(8, 4, 10.0)
    assert dict(zip(T_GRID, cost.pass_seconds(8)))[4] == 10.0
    cost.record_pass(8, 4, 5.0)  # then an EMA
    assert dict(zip(T_GRID, cost.pass_seconds(8)))[4] == pytest.approx(9.0)


def test_a_side_not_played_is_probed_so_its_estimates_do_not_freeze():
    """One slow plain sample (here 3x) must not keep SD on for good: while drafting wins, every
    PROBE-th plan is plain, whose measurement then corrects the cell; then plain plays, SD only as
    a rare exploration."""
    ctl = Controller(EVERY)
    _costs(ctl, (1,), per_token=0.05)
    true_plain = ctl.cost.target[1][1]
    ctl.cost.target[1][1] = 3 * true_plain  # a frozen bad sample
    for _ in range(6):
        ctl.accept.record("eagle", 1, 1)  # the drafter is poor (0.2): SD
    for _ in range(24):  # wins only on paper
        ctl.accept.record("eagle", 1, 0)
    plans = [ctl.plan([30], [[]], [True]) for _ in range(PROBE)]
    assert all(p.drafts for p in plans[:-1]) and not plans[-1].drafts
    ctl.cost.record_pass(1, 1, true_plain)  # the probe measures plain ...
    for _ in range(30):
        ctl.cost.record_pass(1, 1, true_plain)
    # ... and it wins now, but for an exploration every EXPLORE plans
    plans = [ctl.plan([30], [[]], [True]) for _ in range(8 * PROBE)]
    assert sum(p.drafts for p in plans) <= 8 * PROBE // EXPLORE
    explored = next(p for p in plans if p.drafts)
    for _ in range(MIN_SAMPLES):  # which measures SD to lose
        ctl.record_iteration(1, explored, 1, 1.1 / explored.plain_rate)
    assert sum(ctl.plan([30], [[]], [True]).drafts for _ in range(8 * PROBE)) <= 2


def test_calibration_times_only_the_batches_a_source_may_draft_at(monkeypatch):
    """Bare passes are timed up to the first calibration batch at or above the largest batch any source drafts at:
    EAGLE-3 alone (sd_max_batch 16) needs no 32-batch cells (12 of a deep replica's 16 s of calibration)."""
    timed = []
    monkeypatch.setattr(CostModel, "calibrate", lambda self, runner, batches: timed.append(batches))
    for cfg in (
        ControllerConfig(),
        ControllerConfig(sd_max_batch=8),
        ControllerConfig(sd_max_batch=12),
        ControllerConfig(sd_sources=("eagle", "group")),
        ControllerConfig(sd="on"),
    ):
        Controller(cfg).calibrate(runner=None)
    assert timed == [(1, 8, 16), (1, 8), (1, 8, 16), (1, 8, 16, 32), (1, 8, 16, 32)]
