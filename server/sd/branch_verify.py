"""Lossless verification of M draft branches from one root in one target pass (a small token tree).

The tree: the root is the sequence's last committed token; branch m is a chain of lens[m] drafted tokens hanging from it
(branch 0 the group draft, branch 1 the EAGLE-3 chain, say). One target pass scores the root and every branch node with
a tree mask, giving the root's distribution p_0 and, along branch m, the distribution after each of its tokens.

Rule, branch by branch in the fixed order m = 0, 1, ..., with r := p_0 at the root:
- a deterministic branch (a group draft) is a point mass q = 1{x}: accept its first token x with probability r(x)
  (u < r(x)); on rejection r := r with x removed, renormalised;
- a sampled branch (x ~ q, q the drafter's processed distribution): accept with min(1, r(x) / q(x)); on rejection
  r := normalise(max(r - q, 0)).
If no branch's first token is accepted, the root emits a token drawn from the final r. Each test is Leviathan et al.'s
speculative sampling with target r, so the token it emits, or the residual r it hands on, is distributed so that the
root's output token is exactly p_0 (the point mass case: P(x) = r(x), P(y != x) = (1 - r(x)) r(y) / (1 - r(x)) = r(y)).
A draft is fixed before the test's uniform is drawn, and a point-mass draft depends only on the context, so the argument
holds test by test. Once branch m's first token is accepted, the walk continues down branch m alone as the textbook
chain (first rejection: residual; all accepted: a bonus token from the last distribution), each node's distribution
being the target's given exactly the emitted prefix. Branches are not merged into a trie: two branches starting with the
same token stay two nodes (the second is then rejected with certainty and its residual still applied, as the rule says),
so a shared prefix costs duplicate positions in the pass but never the losslessness argument. Greedy (temperature 0):
the root emits the target's argmax, follows the first branch starting with it, then accepts while the draft equals the
argmax."""

from __future__ import annotations

import torch

from gleanrl.server.sampling.sampler import sample


def _test(
    r: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor, on: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """r [B, V] current target; x [B] draft tokens; q [B, V] their draft distribution (None: point masses); u [B]
    uniforms; on [B] rows that test. Returns (accepted [B], residual r after a rejection)."""
    r_x = r.gather(-1, x[:, None])[:, 0]  # [B]
    q_x = torch.ones_like(r_x) if q is None else q.gather(-1, x[:, None])[:, 0].float()
    accepted = on & (u * q_x < r_x)  # u < r/q, no division by q = 0
    rest = r.scatter(-1, x[:, None], 0.0) if q is None else (r - q).clamp_min(0)
    mass = rest.sum(-1, keepdim=True)
    rest = torch.where(mass > 0, rest / mass.clamp_min(1e-30), r)  # mass 0: rejection had prob. 0
    return accepted, torch.where((on & ~accepted)[:, None], rest, r)


def verify_branches(
    drafts: torch.Tensor,
    lens: torch.Tensor,
    root_probs: torch.Tensor,
    branch_probs: torch.Tensor,
    generators: list[torch.Generator | None],
    draft_q: torch.Tensor | None = None,
    point: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """drafts [B, M, k] (branch m of row b is drafts[b, m, :lens[b, m]]), lens [B, M]; root_probs [B, V]; branch_probs
    [B, M, k, V] (after each branch token); draft_q [B, M, k, V] the sampled branches' draft distributions, point [B, M]
    True for point-mass branches (default: all). Returns (branch [B], -1 when the root rejected every branch; n_accepted
    [B] in 0..k; out_ids [B, k+1]); emit out_ids[b, :n_accepted[b] + 1]."""
    bsz, m_branches, k = drafts.shape
    rows = torch.arange(bsz, device=drafts.device)
    point = torch.ones(bsz, m_branches, dtype=torch.bool, device=drafts.device) if point is None else point
    u = _uniforms(lens, generators, m_branches + k).to(drafts.device)  # [B, M+k]
    r, branch = root_probs.float(), torch.full((bsz,), -1, dtype=torch.long, device=drafts.device)
    for m in range(m_branches):
        x = drafts[:, m, 0]  # the root's tests, in order
        acc, r = _test(r, x, _draft_dist(draft_q, point, m, 0, x), u[:, m], (branch < 0) & (lens[:, m] > 0))
        branch = torch.where(acc, m, branch)
    chosen = branch.clamp_min(0)
    d, n_len = drafts[rows, chosen], torch.where(branch >= 0, lens[rows, chosen], 0)  # [B, k], [B]
    p = branch_probs[rows, chosen].float()  # [B, k, V]
    q_c = None if draft_q is None else draft_q[rows, chosen][:, None]  # [B, 1, k, V]
    pt = point[rows, chosen][:, None]  # [B, 1]
    n_acc = (branch >= 0).long()  # the root token is accepted
    live = branch >= 0
    out = torch.cat([d, d.new_zeros(bsz, 1)], dim=1)  # [B, k+1]
    for j in range(1, k + 1):  # down the chosen branch
        if not bool(live.any()):
            break
        r_j = p[:, j - 1]  # after d[:, :j]
        on = live & (j < n_len)
        if j < k and bool(on.any()):
            acc, r_j = _test(r_j, d[:, j], _draft_dist(q_c, pt, 0, j, d[:, j]), u[:, m_branches + j], on)
            n_acc = n_acc + acc.long()
            stop = live & ~acc
        else:
            stop = live
        r = torch.where(stop[:, None], r_j, r)  # live rows: n_acc == j
        live = live & ~stop
    out[rows, n_acc] = sample(r, generators)  # residual or bonus token
    return branch, n_acc, out


def _uniforms(lens: torch.Tensor, generators: list[torch.Generator | None], width: int) -> torch.Tensor:
    """[B, width]: row b draws exactly (its branches + its longest branch) uniforms from its own generator, whatever
    else is in the batch (so a seeded request's draws depend on its own drafts only); slots 0..M-1 serve the root tests,
    M + j the test at depth j; unused slots are 1 (never read)."""
    m = lens.shape[1]
    u = torch.ones(lens.shape[0], width)
    for b, (row, g) in enumerate(zip(lens.tolist(), generators)):
        mb, kb = sum(n > 0 for n in row), max(row, default=0)
        draw = torch.rand(mb + kb, generator=g)
        u[b, :mb], u[b, m : m + kb] = draw[:mb], draw[mb:]
    return u


def _draft_dist(q: torch.Tensor | None, point: torch.Tensor, m: int, j: int, x: torch.Tensor) -> torch.Tensor | None:
    """The draft distribution [B, V] of token j of branch m (q [B, M, k, V], point [B, M]), with point-mass rows as 1{x}
    (so one _test serves mixed rows); None when every row is a point mass."""
    if q is None or bool(point[:, m].all()):
        return None
    one_hot = torch.zeros_like(q[:, m, j], dtype=torch.float32).scatter(-1, x[:, None], 1.0)
    return torch.where(point[:, m, None], one_hot, q[:, m, j].float())


def verify_branches_greedy(
    drafts: torch.Tensor, lens: torch.Tensor, root_ids: torch.Tensor, branch_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """drafts [B, M, k], lens [B, M]; root_ids [B] and branch_ids [B, M, k] the target's argmax at the root and after
    each branch token. Same returns as verify_branches."""
    bsz, m_branches, k = drafts.shape
    rows = torch.arange(bsz, device=drafts.device)
    first = (drafts[:, :, 0] == root_ids[:, None]) & (lens > 0)  # [B, M]
    idx = torch.arange(m_branches, device=drafts.device).expand(bsz, -1)
    branch = torch.where(first, idx, m_branches).min(dim=1).values  # the first matching branch
    branch = torch.where(branch < m_branches, branch, -1)
    chosen = branch.clamp_min(0)
    d, t, n_len = drafts[rows, chosen], branch_ids[rows, chosen], lens[rows, chosen]  # [B, k] x2, [B]
    match = (d[:, 1:] == t[:, :-1]) & (torch.arange(1, k, device=d.device)[None] < n_len[:, None])
    n_acc = torch.where(branch >= 0, 1 + match.long().cumprod(dim=1).sum(dim=1), 0)  # [B]
    return branch, n_acc, torch.cat([root_ids[:, None], t], dim=1)  # out [B, k+1]: t[j-1] follows d[:j]
