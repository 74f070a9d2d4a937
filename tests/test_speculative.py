"""SD verification math on chains (one-branch trees of `branch_verify`): greedy cases and a
statistical test that sampled SD output follows the target.

The statistical test drives the chain verifier with a Markov-chain "target" P and a deliberately
poor "drafter" Q (mass concentrated on tokens P finds unlikely, and on tokens P excludes, as
top-k/top-p/min-p would). Every emitted token is a transition (prev -> next); under exact
speculative sampling each transition's next token follows P[prev] whatever Q is, and whichever
position in the chain it comes from. We pool >= 20,000 emitted tokens and run Pearson's chi-square
against P per `prev` row, summed over rows (independent multinomials, so the sum is chi-square with
the summed degrees of freedom). The threshold is the 1 - 1e-6 quantile (Wilson-Hilferty), so a
correct implementation fails with probability ~1e-6 (and never at the fixed seed); the negative
control shows the same statistic rejects the classic bug of resampling from p instead of the
residual max(p - q, 0).
"""

from __future__ import annotations

import math

import torch

from gleanrl.server.sd.branch_verify import verify_branches, verify_branches_greedy

V, K, ROWS = 6, 4, 400


def verify_sampled(draft_ids, q_probs, p_probs, gens, lens=None):
    """A chain as a one-branch tree: draft_ids [B, k] ~ q_probs [B, k, V]; p_probs [B, k+1, V]."""
    b, k = draft_ids.shape
    lens = torch.full((b,), k) if lens is None else lens
    _, n_acc, out = verify_branches(
        draft_ids[:, None],
        lens[:, None],
        p_probs[:, 0],
        p_probs[:, None, 1:],
        gens,
        q_probs[:, None],
        torch.zeros(b, 1, dtype=torch.bool),
    )
    return n_acc, out


def verify_greedy(draft_ids, target_ids, lens=None):
    b, k = draft_ids.shape
    lens = torch.full((b,), k) if lens is None else lens
    _, n_acc, out = verify_branches_greedy(draft_ids[:, None], lens[:, None], target_ids[:, 0], target_ids[:, None, 1:])
    return n_acc, out


def _chains(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, V, generator=g) ** 3 + 0.02  # [V, V] transition rows
    # excluded tokens (top-k-like)
    p[torch.arange(V), torch.arange(V)] = 0.0
    p = p / p.sum(-1, keepdim=True)
    # poor: loves what p dislikes
    q = 1.0 / (p + 0.05)
    return p, q / q.sum(-1, keepdim=True)


def _draft(p: torch.Tensor, q: torch.Tensor, gens: list[torch.Generator]):
    """Per row: a start token, K drafts sampled from q along the chain, and the k+1 target rows."""
    start = torch.stack([torch.randint(V, (), generator=g) for g in gens])  # [B]
    prev, drafts = start, []
    for _ in range(K):
        drafts.append(torch.stack([torch.multinomial(q[s], 1, generator=g)[0] for s, g in zip(prev, gens)]))
        prev = drafts[-1]
    draft_ids = torch.stack(drafts, dim=1)  # [B, K]
    prevs = torch.cat([start[:, None], draft_ids], dim=1)  # [B, K+1]
    # q: [B,K,V], p: [B,K+1,V]
    return start, draft_ids, q[prevs[:, :K]], p[prevs]


def _transition_counts(p: torch.Tensor, q: torch.Tensor, verify_fn, min_tokens: int = 20_000) -> torch.Tensor:
    gens = [torch.Generator().manual_seed(1000 + b) for b in range(ROWS)]
    counts = torch.zeros(V, V, dtype=torch.int64)
    while counts.sum() < min_tokens:
        start, draft_ids, q_probs, p_probs = _draft(p, q, gens)
        n_acc, out = verify_fn(draft_ids, q_probs, p_probs, gens)
        # prev of out[:, j]
        prevs = torch.cat([start[:, None], out[:, :-1]], dim=1)
        for b in range(ROWS):
            n = int(n_acc[b]) + 1
            counts.index_put_((prevs[b, :n], out[b, :n]), torch.ones(n, dtype=torch.int64), accumulate=True)
    return counts


def _chi2_exceeds(counts: torch.Tensor, p: torch.Tensor, alpha_z: float = 4.753) -> tuple[float, float]:
    """Returns (statistic, threshold); alpha_z is the standard normal 1 - 1e-6 quantile."""
    stat, df = 0.0, 0
    for prev in range(V):
        n, support = counts[prev].sum().item(), p[prev] > 0
        expected = n * p[prev][support].double()
        stat += (((counts[prev][support].double() - expected) ** 2) / expected).sum().item()
        df += int(support.sum()) - 1
    c = 2.0 / (9.0 * df)
    return stat, df * (1.0 - c + alpha_z * math.sqrt(c)) ** 3


def _resample_from_p_bug(draft_ids, q_probs, p_probs, gens):
    """Accept with min(1, p/q) but on rejection draw from p: a classic, subtly wrong variant."""
    n_acc, out = verify_sampled(draft_ids, q_probs, p_probs, gens)
    rows = torch.arange(len(gens))
    p_n = p_probs[rows, n_acc]
    out[rows, n_acc] = torch.stack([torch.multinomial(p_n[b], 1, generator=g)[0] for b, g in enumerate(gens)])
    return n_acc, out


def test_sampled_output_follows_target_distribution():
    torch.manual_seed(0)
    p, q = _chains(seed=0)
    counts = _transition_counts(p, q, verify_sampled)
    assert counts.sum() >= 20_000
    assert counts[p == 0].sum() == 0, "emitted a token the target excludes"
    stat, threshold = _chi2_exceeds(counts, p)
    assert stat < threshold, f"chi-square {stat:.1f} >= {threshold:.1f}: SD output is not distributed as the target"


def test_chi_square_rejects_resampling_from_p():
    torch.manual_seed(0)
    p, q = _chains(seed=0)
    stat, threshold = _chi2_exceeds(_transition_counts(p, q, _resample_from_p_bug), p)
    assert stat > threshold, "the statistical test has no power against a known bug"


def test_perfect_draft_is_always_accepted():
    p, _ = _chains(seed=1)
    gens = [torch.Generator().manual_seed(b) for b in range(64)]
    _, draft_ids, _, p_probs = _draft(p, p, gens)
    n_acc, out = verify_sampled(draft_ids, p_probs[:, :K], p_probs, gens)
    assert (n_acc == K).all()
    assert torch.equal(out[:, :K], draft_ids)


def test_greedy_accepts_leading_matches_and_emits_target_tokens():
    target = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [1, 2, 3, 4, 0]])
    drafts = torch.tensor([[5, 6, 7, 8], [5, 0, 7, 8], [0, 6, 7, 8], [1, 2, 3, 0]])
    n_acc, out = verify_greedy(drafts, target)
    assert n_acc.tolist() == [4, 1, 0, 3]
    emitted = [out[b, : int(n) + 1].tolist() for b, n in enumerate(n_acc)]
    assert emitted == [[5, 6, 7, 8, 9], [5, 6], [5], [1, 2, 3, 4]]


def test_greedy_padding_is_never_accepted():
    target = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 8, 9]])
    # row 1 drafted 2 tokens; the rest is padding
    drafts = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    n_acc, out = verify_greedy(drafts, target, torch.tensor([4, 2]))
    assert n_acc.tolist() == [4, 2]
    assert out[1, :3].tolist() == [5, 6, 7]  # its bonus is the target's token after its last draft


def test_ragged_rows_verify_as_if_alone():
    """A row with k_b < K drafts, padded into a batch, gives exactly what it gives alone with k_b:
    it draws k_b uniforms, never accepts padding, and takes its bonus from p_{k_b + 1}."""
    p, q = _chains(seed=3)
    gens = [torch.Generator().manual_seed(b) for b in range(16)]
    # q = p: every real draft is accepted
    _, draft_ids, q_probs, p_probs = _draft(p, p, gens)
    lens = torch.tensor([K, 1, 2, 3] * 4)
    # padding: junk q
    junk = torch.where(torch.arange(K)[None, :, None] < lens[:, None, None], q_probs, 0.5)
    seeds = [torch.Generator().manual_seed(100 + b) for b in range(16)]
    n_acc, out = verify_sampled(draft_ids, junk, p_probs, seeds, lens)
    assert n_acc.tolist() == lens.tolist()
    for b in range(16):
        k = int(lens[b])
        alone = verify_sampled(
            draft_ids[b : b + 1, :k],
            q_probs[b : b + 1, :k],
            p_probs[b : b + 1, : k + 1],
            [torch.Generator().manual_seed(100 + b)],
        )
        assert int(alone[0][0]) == k and out[b, : k + 1].tolist() == alone[1][0].tolist()
    p2, q2 = _chains(seed=4)
    _, d2, qp2, pp2 = _draft(p2, q2, [torch.Generator().manual_seed(b) for b in range(16)])
    n2, o2 = verify_sampled(d2, qp2, pp2, [torch.Generator().manual_seed(7 + b) for b in range(16)], lens)
    for b in range(16):  # with rejections too: same tokens as alone
        k = int(lens[b])
        n1, o1 = verify_sampled(
            d2[b : b + 1, :k], qp2[b : b + 1, :k], pp2[b : b + 1, : k + 1], [torch.Generator().manual_seed(7 + b)]
        )
        assert int(n2[b]) == int(n1[0]) and o2[b, : int(n1[0]) + 1].tolist() == o1[0, : int(n1[0]) + 1].tolist()
