"""The plan of highest expected rate: which drafts to verify this iteration, by the estimates (`CostModel`,
`Acceptance`); whether it plays is the controller's (`controller.py`).

Rule. With B decode-ready sequences, a plan verifies for each sequence s its own draft tree (nothing, the group draft's
first tokens, an EAGLE-3 chain of up to k tokens, or both as two branches) of l_s draft tokens, in one target pass of
N = B + sum_s l_s rows, after one drafter call of k steps when any sequence takes a chain. Its expected rate is

    rate = (B + sum_s E[accepted_s]) / (target(B, N / B) + [any chain] * drafter(B_e, k)),

where E[accepted] of a chain with conditional acceptances a_1.. a_l is sum_j prod_{i<=j} a_i and of a two-branch tree
(group first, then EAGLE-3 on the residual) E_group + (1 - a_group,1) * E_eagle. For each k in `K_GRID` (and 0: group
drafts only) the per-sequence lengths come from Dinkelbach's iteration on that ratio: each sequence takes the l_s
maximising E[accepted_s(l)] - rate * (target seconds per row) * l, so a sequence whose drafts do not pay for their rows
takes none, one that is accepted often takes a long one. Plain decoding is N = B (rate B / target(B, 1))."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gleanrl.server.config import ControllerConfig
from gleanrl.server.sampling.sequence import Sequence
from gleanrl.server.sd.acceptance import MAX_DEPTH, Acceptance, expected_accepted
from gleanrl.server.sd.cost_model import GRID, CostModel

K_GRID = (1, 2, 3, 4, 5, 6, 8)  # EAGLE-3 chain lengths
EXPLORE_DEPTHS = 4  # a look's chain: at most this many depths past the measured ones (a plan by estimates: 1)


@dataclass(frozen=True, slots=True)
class Plan:
    group_lens: list[int]  # per sequence: group draft tokens to verify (0: none)
    eagle_lens: list[int]  # per sequence: EAGLE-3 chain tokens to draft and verify (0: none)
    expected_rate: float  # tokens per second the plan expects
    plain_rate: float  # and plain decoding

    @property
    def drafts(self) -> bool:
        return any(self.group_lens) or any(self.eagle_lens)


def best_plan(
    config: ControllerConfig,
    accept: Acceptance,
    cost: CostModel,
    caps: np.ndarray,
    group_probs: list[list[float]] | None,
    elig: np.ndarray,
    keys: list[Sequence] | None,
    secs: np.ndarray,
    plain_rate: float,
    explore: bool,
    force: bool = False,
) -> Plan | None:
    """The plan of highest expected rate that drafts (None: none does), by the rule above. `force` (mode on): every
    sequence that can takes its most valuable tree within k, whatever its rows cost."""
    cfg, b, k = config, len(caps), config.num_draft_tokens
    rows = np.arange(b)
    ks = ([k] if k else list(K_GRID)) if elig.any() and "eagle" in cfg.sd_sources else []
    if not force:  # no deeper than one past what is measured (exploring: EXPLORE_DEPTHS past)
        deepest = accept.measured_depths() + (EXPLORE_DEPTHS if explore else 1)
        ks = [k for k in ks if k <= deepest]
    if group_probs is not None:
        glen = np.minimum(np.array([len(p) for p in group_probs]), caps)
        g_exp, g_first = accept.group_expected(group_probs, glen)  # [B, 33], [B]
    else:
        glen, g_exp, g_first = np.zeros(b, dtype=int), np.zeros((b, MAX_DEPTH + 1)), np.zeros(b)
    # l = 0 .. longest usable tree (L + 1 <= 33 columns)
    ls = np.arange(1 + min(int(caps.max()), (max(ks) if ks else 0) + int(glen.max())))[None]
    fits = ls <= caps[:, None]  # [B, L + 1]
    g_use = np.minimum(ls, glen[:, None])  # [B, L + 1]
    g_val = g_exp[rows[:, None], g_use]
    e_exp = expected_accepted(
        accept.seq_eagle_rates(keys, explore) if keys else accept.eagle_rates(explore)[None].repeat(b, 0)
    )
    # every chain length at once: [K, B, L + 1] over (k, sequence, draft tokens l)
    kk = np.array([0] + ks)[:, None, None]  # [K, 1, 1]
    r3, on3 = rows[None, :, None], elig[None, :, None] & (kk > 0)
    e_use = np.minimum(ls[None], kk)  # [K, 1, L + 1]
    e_val = np.where(on3, e_exp[r3, e_use], 0.0)  # [K, B, L + 1]
    val = np.maximum(g_val[None], e_val)
    use = np.where(e_val > g_val[None], e_use, g_use[None])
    kind = (e_val > g_val[None]).astype(int)  # 0 group, 1 chain
    if "fused" in cfg.sd_sources and group_probs is not None and ks:
        f_g = np.minimum(np.maximum(ls[None] - kk, 0), glen[None, :, None])  # [K, B, L+1]
        f_val = np.where(
            on3 & (f_g > 0),
            g_exp[r3, f_g] + (1 - g_first[None, :, None]) * e_exp[rows[None], kk[:, :, 0]][:, :, None],
            0.0,
        )
        better = f_val > val
        val, use, kind = np.where(better, f_val, val), np.where(better, kk + f_g, use), np.where(better, 2, kind)
    val, use = np.where(fits[None], val, 0.0), np.where(fits[None], use, 0)
    if force:
        val = np.where(use > 0, val, -np.inf)
    step = cost.draft_seconds(int(elig.sum()), 0) if ks else 0.0
    draft_s = step * (kk[:, 0, 0] + 1) * (kk[:, 0, 0] > 0)  # [K]
    # target seconds of a pass of b + j rows, j = 0 .. 33 b
    cost = np.interp((b + np.arange(33 * b + 1)) / b, GRID, secs)
    rate, n = np.full(len(kk), plain_rate), np.zeros(len(kk), dtype=int)  # n: draft rows
    k_idx = np.arange(len(kk))[:, None]
    kind = np.broadcast_to(kind, val.shape)
    best, best_rate = None, -1.0
    for _ in range(3):  # Dinkelbach's iteration, every k at once
        price = rate * (cost[np.minimum(n + b, 33 * b)] - cost[n]) / b  # [K] per row
        if force:  # mode on: each its most valuable tree
            price[:] = 0.0
        pick = (val - price[:, None, None] * use).argmax(2)  # [K, B]
        at = (k_idx, rows[None], pick)
        v, u, kd = val[at], use[at], kind[at]  # [K, B] each
        n = u.sum(1)
        chain = ((kd > 0) & (u > 0)).any(1)
        new = np.where(
            u.any(1),
            (b + np.where(np.isfinite(v), v, 0).sum(1)) / (cost[np.minimum(n, 33 * b)] + np.where(chain, draft_s, 0.0)),
            -1.0,
        )
        i = int(new.argmax())
        if new[i] > best_rate:
            k = int(kk[i, 0, 0])
            eagle_lens = np.where(kd[i] == 1, u[i], np.where(kd[i] == 2, k, 0))
            best_rate = float(new[i])
            best = Plan((u[i] - eagle_lens).tolist(), eagle_lens.tolist(), best_rate, plain_rate)
        rate = np.where(new > 0, new, rate)
    return best
