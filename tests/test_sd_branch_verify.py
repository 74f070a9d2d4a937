"""Verification of deterministic (group) and sampled (EAGLE) draft branches: greedy cases and a
chi-square test that the sampled output follows the target, with a negative control that breaks the
rejection rule.

As in test_speculative.py the "target" is a Markov chain P over V tokens: after token t the next
token follows P[t], so each emitted transition (prev -> next) must follow P[prev] whatever the
drafts were. The group branch is a deterministic chain x_{j+1} = f(x_j), f mixing likely, unlikely
and excluded tokens; the EAGLE branch is sampled from a poor drafter Q; branch lengths are random (0
included) and the two branches often start with the same token. Pearson's chi-square over >= 20,000
transitions is compared with its 1 - 1e-6 quantile.
"""

from __future__ import annotations

import math

import pytest
import torch

from gleanrl.server.sd import branch_verify
from gleanrl.server.sd.branch_verify import verify_branches, verify_branches_greedy

V, K, ROWS = 6, 4, 400
# the group draft's next token after t (f(t) = t: excluded by P)
F = torch.tensor([0, 2, 3, 3, 1, 0])


def _chains() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    p = torch.rand(V, V, generator=g) ** 3 + 0.02
    p[torch.arange(V), torch.arange(V)] = 0.0
    p = p / p.sum(-1, keepdim=True)
    q = 1.0 / (p + 0.05)
    return p, q / q.sum(-1, keepdim=True)


def _drafts(p, q, gens, order: tuple[str, ...]):
    """Per row: start token, drafts [B, M, K], lens [B, M], root p [B, V], branch p [B, M, K,
    V], q, point."""
    start = torch.stack([torch.randint(V, (), generator=g) for g in gens])  # [B]
    branches, qs = [], []
    for kind in order:
        prev, toks = start, []
        for _ in range(K):
            nxt = (
                F[prev]
                if kind == "group"
                else torch.stack([torch.multinomial(q[s], 1, generator=g)[0] for s, g in zip(prev, gens)])
            )
            toks.append(nxt)
            prev = nxt
        d = torch.stack(toks, dim=1)  # [B, K]
        branches.append(d)
        qs.append(q[torch.cat([start[:, None], d[:, :-1]], dim=1)])  # [B, K, V]
    drafts = torch.stack(branches, dim=1)  # [B, M, K]
    lens = torch.stack([torch.randint(K + 1, (len(order),), generator=g) for g in gens])
    point = torch.tensor([[kind == "group" for kind in order]] * len(gens))
    return start, drafts, lens, p[start], p[drafts], torch.stack(qs, dim=1), point


def _counts(order, seed: int = 0, min_tokens: int = 20_000) -> tuple[torch.Tensor, torch.Tensor]:
    p, q = _chains()
    gens = [torch.Generator().manual_seed(seed * 10_000 + b) for b in range(ROWS)]
    counts = torch.zeros(V, V, dtype=torch.int64)
    while counts.sum() < min_tokens:
        start, drafts, lens, root_p, branch_p, draft_q, point = _drafts(p, q, gens, order)
        _, n_acc, out = verify_branches(drafts, lens, root_p, branch_p, gens, draft_q, point)
        prevs = torch.cat([start[:, None], out[:, :-1]], dim=1)
        for b in range(ROWS):
            n = int(n_acc[b]) + 1
            counts.index_put_((prevs[b, :n], out[b, :n]), torch.ones(n, dtype=torch.int64), accumulate=True)
    return counts, p


def _chi2(counts: torch.Tensor, p: torch.Tensor, z: float = 4.753) -> tuple[float, float]:
    stat, df = 0.0, 0
    for prev in range(V):
        n, support = counts[prev].sum().item(), p[prev] > 0
        expected = n * p[prev][support].double()
        stat += (((counts[prev][support].double() - expected) ** 2) / expected).sum().item()
        df += int(support.sum()) - 1
    c = 2.0 / (9.0 * df)
    return stat, df * (1.0 - c + z * math.sqrt(c)) ** 3


@pytest.mark.parametrize("order", [("group",), ("group", "eagle"), ("eagle", "group"), ("group", "group")])
def test_sampled_output_follows_the_target(order):
    counts, p = _counts(order)
    assert counts[p == 0].sum() == 0, "emitted a token the target excludes"
    stat, threshold = _chi2(counts, p)
    assert stat < threshold, f"chi-square {stat:.1f} >= {threshold:.1f}: not distributed as the target"


_TEST = branch_verify._test


def _keep_x_on_rejection(r, x, q, u, on):
    """The broken rule: a rejected point-mass token stays in the residual (drawn as
    often as before)."""
    accepted, rest = _TEST(r, x, q, u, on)
    return accepted, r if q is None else rest


def test_chi_square_fails_when_the_rejection_rule_is_broken(monkeypatch):
    monkeypatch.setattr(branch_verify, "_test", _keep_x_on_rejection)
    counts, p = _counts(("group", "eagle"))
    stat, threshold = _chi2(counts, p)
    assert stat > threshold, "the statistical test has no power against a broken rejection rule"


def test_a_correct_point_mass_draft_is_accepted_with_certainty():
    # deterministic target: t -> t + 1
    p = torch.eye(V)[torch.tensor([1, 2, 3, 4, 5, 0])]
    gens = [torch.Generator().manual_seed(b) for b in range(8)]
    start = torch.arange(8) % V
    drafts = torch.stack([(start + 1 + j) % V for j in range(K)], dim=1)[:, None]  # [B, 1, K]
    branch, n_acc, out = verify_branches(drafts, torch.full((8, 1), K), p[start], p[drafts], gens)
    assert (branch == 0).all() and (n_acc == K).all() and torch.equal(out[:, :K], drafts[:, 0])


def test_greedy_follows_the_first_matching_branch():
    drafts = torch.tensor(
        [
            [[5, 6, 7], [5, 6, 0]],  # both start right: branch 0 first
            [[1, 0, 0], [5, 6, 0]],  # branch 0 wrong at the root: branch 1
            [[1, 0, 0], [2, 0, 0]],  # neither: the root emits the target's token
            [[5, 6, 7], [5, 6, 7]],
        ]
    )  # branch 0 has length 0: branch 1
    lens = torch.tensor([[3, 3], [1, 2], [1, 1], [0, 3]])
    root = torch.tensor([5, 5, 5, 5])
    # target after each branch token
    after = torch.tensor([6, 7, 8])[None, None].expand(4, 2, 3)
    branch, n_acc, out = verify_branches_greedy(drafts, lens, root, after)
    assert branch.tolist() == [0, 1, -1, 1] and n_acc.tolist() == [3, 2, 0, 3]
    assert [out[b, : n + 1].tolist() for b, n in enumerate(n_acc.tolist())] == [
        [5, 6, 7, 8],
        [5, 6, 7],
        [5],
        [5, 6, 7, 8],
    ]


def test_greedy_rows_through_the_sampled_rule_match_the_greedy_rule():
    """One-hot target rows (temperature 0 in the sampler) make the point-mass rule
    accept iff argmax."""
    p, q = _chains()
    gens = [torch.Generator().manual_seed(b) for b in range(64)]
    start, drafts, lens, root_p, branch_p, draft_q, point = _drafts(p, q, gens, ("group", "eagle"))
    one_hot = lambda probs: torch.nn.functional.one_hot(probs.argmax(-1), V).float()  # noqa: E731
    b_s, n_s, out_s = verify_branches(drafts, lens, one_hot(root_p), one_hot(branch_p), gens, draft_q, point)
    b_g, n_g, out_g = verify_branches_greedy(drafts, lens, root_p.argmax(-1), branch_p.argmax(-1))
    assert torch.equal(b_s, b_g) and torch.equal(n_s, n_g)
    for b, n in enumerate(n_g.tolist()):
        assert out_s[b, : n + 1].tolist() == out_g[b, : n + 1].tolist()
