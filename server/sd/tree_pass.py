"""One target pass over every sequence's draft tree (root + up to M branches), verified in one batched call.

Each sequence's tree (`DraftTree`) is fed from its cache length on (the root, its last token, is the one token its cache
lacks); the pass scores every node, `branch_verify` picks per sequence one branch and its accepted prefix, and
`keep_path` compacts the cache to exactly that path. A sequence without branches is a bare root: a plain decode step;
one branch is a chain. Rows whose target distribution is needed are gathered into [B, M, k, V] (padding repeats the root
row; its lens entry is 0, so it is never read as a draft).

Penalties, min_new_tokens and logit_bias apply at every node with the counts of the output plus the branch tokens before
it (`sampler.penalised`, one window per branch): each draft is verified against exactly the distribution plain decoding
would use there, so SD stays lossless; the drafter's q stays unpenalised, which costs acceptance only. Returned, top and
token-id logprobs of each emitted token come from its node's penalised row, as plain decoding's from its step's. A
grammar's mask is applied the same way (`sampling.grammar`): a draft it forbids has probability 0 at its node.

A tree's t = 1 + sum(len_m) new tokens are laid out [root, branch 0 tokens, branch 1 tokens, ...]; branch m's token j
sits at position root_pos + 1 + j and attends to the cache, the root and branch m's tokens 0..j only. After verification
the accepted path (root, then the first n tokens of one branch) is moved to the front of the new rows (`keep_path`), so
the cache again holds one contiguous sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gleanrl.server.model.kv import SeqKVCache
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.sampling import sampler
from gleanrl.server.sd.branch_verify import verify_branches, verify_branches_greedy


@dataclass(frozen=True, slots=True)
class DraftTree:
    tokens: list[int]  # [t]: root, then each branch
    positions: list[int]  # [t]
    offsets: list[int]  # offsets[m]: row of branch m's first token
    lens: list[int]  # tokens per branch

    @property
    def size(self) -> int:
        return len(self.tokens)

    def mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[t, t] bool: row i may attend to column j (j is i or one of its ancestors)."""
        m = torch.zeros(self.size, self.size, dtype=torch.bool, device=device)
        m[:, 0] = True
        for off, n in zip(self.offsets, self.lens):
            m[off : off + n, off : off + n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        return m

    def rows(self, branch: int, n: int) -> list[int]:
        """Rows of the accepted path: the root, then branch `branch`'s first n tokens (branch -1: root only)."""
        return [0] + (list(range(self.offsets[branch], self.offsets[branch] + n)) if branch >= 0 else [])

    def branch_rows(self, m: int) -> list[int]:
        """Rows whose target distribution follows branch m's tokens 0..len-1 (the root's row first)."""
        return [0] + list(range(self.offsets[m], self.offsets[m] + self.lens[m]))


def build_tree(root: int, root_pos: int, branches: list[list[int]]) -> DraftTree:
    tokens, positions, offsets = [root], [root_pos], []
    for b in branches:
        offsets.append(len(tokens))
        tokens += b
        positions += range(root_pos + 1, root_pos + 1 + len(b))
    return DraftTree(tokens, positions, offsets, [len(b) for b in branches])


@torch.inference_mode()
def keep_path(cache: SeqKVCache, start: int, rows: list[int]) -> None:
    """The tree's new K/V begin at cache position `start`; keep exactly the given rows (ascending, rows[0] == 0) as
    positions start, start + 1, ... and drop the rest."""
    if rows != list(range(len(rows))):
        src = torch.tensor(rows, device=cache.k[0].device) + start
        for buf in (cache.k, cache.v):
            for layer in buf:  # [n_kv, capacity, d]
                layer[:, start : start + len(rows)] = layer[:, src]
    cache.truncate(start + len(rows))


@dataclass(frozen=True, slots=True)
class TreeResult:
    branch: int  # accepted branch (-1: none, the root's own token)
    accepted: int  # draft tokens accepted
    ids: list[int]  # emitted: accepted drafts + one corrected/bonus token
    logprobs: list[float]
    rows: list[int]  # rows of the pass (into `aux`) on the accepted path, root first


@torch.inference_mode()
def tree_pass(
    runner: ModelRunner,
    seqs: list,
    branches: list[list[list[int]]],
    qs: list[list[torch.Tensor | None]],
    prm: dict[str, torch.Tensor],
    capture_layers: list[int] | None = None,
) -> tuple[list[TreeResult], torch.Tensor | None]:
    """branches[b][m]: branch m's tokens for seqs[b] (m fixes the verification order); qs[b][m]: its draft distributions
    [len, V] (EAGLE, sampled requests) or None (a point-mass draft). prm: params_tensors of seqs. Returns per sequence a
    TreeResult, and the aux hidden states [N, 3*H] of the pass."""
    device, m_max = runner.device, max([len(b) for b in branches] + [1])  # M >= 1: lens 0 = a bare root
    k = max([len(x) for b in branches for x in b] + [1])
    starts = [s.cache.length for s in seqs]
    trees = [build_tree(s.tokens(p0, p0 + 1)[0], p0, b) for s, p0, b in zip(seqs, starts, branches)]
    masks = [t.mask(device) if len(b) > 1 else None for t, b in zip(trees, branches)]
    logits, aux = runner.forward(  # [N, V], [N, 3*H]
        torch.tensor([x for t in trees for x in t.tokens], device=device),
        torch.tensor([p for t in trees for p in t.positions], device=device),
        [s.cache for s in seqs],
        [t.size for t in trees],
        capture_layers=capture_layers,
        last_only=False,
        tree_masks=masks if any(m is not None for m in masks) else None,
    )
    base = torch.tensor([t.size for t in trees]).cumsum(0) - torch.tensor([t.size for t in trees])
    logits = _penalised_tree(logits, seqs, trees, branches, base.tolist())
    drafts = torch.zeros(len(seqs), m_max, k, dtype=torch.long)
    lens = torch.zeros(len(seqs), m_max, dtype=torch.long)
    rows = base[:, None, None].repeat(1, m_max, k + 1)  # [B, M, k+1] root row
    for b, (t, br) in enumerate(zip(trees, branches)):
        for m, x in enumerate(br):
            drafts[b, m, : len(x)], lens[b, m] = torch.tensor(x, dtype=torch.long), len(x)
            rows[b, m, : len(x) + 1] = base[b] + torch.tensor(t.branch_rows(m))
    drafts, lens, rows = drafts.to(device), lens.to(device), rows.to(device)
    branch, n_acc, out = _verify(logits, rows, drafts, lens, seqs, qs, prm, m_max, k)
    paths = [t.rows(int(br), int(n)) for t, br, n in zip(trees, branch.tolist(), n_acc.tolist())]
    glob = [[int(base[b]) + r for r in path] for b, path in enumerate(paths)]
    ids = [out[b, : len(path)] for b, path in enumerate(paths)]
    lps = _logprobs(logits, seqs, glob, ids, prm["temperature"])
    asking = [
        b
        for b, s in enumerate(seqs)
        if s.req.return_logprob and (s.req.top_logprobs_num > 0 or s.req.token_ids_logprob)
    ]
    if asking:
        each = [b for b in asking for _ in glob[b]]  # a sequence per emitted token
        sampler.record_extras(
            logits[[r for b in asking for r in glob[b]]], [seqs[b] for b in each], prm["temperature"][each]
        )
    for s, start, path in zip(seqs, starts, paths):
        keep_path(s.cache, start, path)
    return [TreeResult(int(branch[b]), len(p) - 1, ids[b].tolist(), lps[b], glob[b]) for b, p in enumerate(paths)], aux


def _penalised_tree(
    logits: torch.Tensor, seqs: list, trees: list, branches: list[list[list[int]]], base: list[int]
) -> torch.Tensor:
    """logits [N, V] of the pass -> penalised: each branch is one window [root, its tokens]."""
    if not any(s.req.params.logits_processed for s in seqs):
        return logits
    rows, wseqs, wdrafts = [], [], []
    for s, t, br, b0 in zip(seqs, trees, branches, base):
        for m, d in enumerate(br or [[]]):
            rows += [b0 + r for r in (t.branch_rows(m) if br else [0])]
            wseqs.append(s)
            wdrafts.append(d)
    idx = torch.tensor(rows, device=logits.device)
    out = logits.clone()
    out[idx] = sampler.penalised(logits[idx], wseqs, wdrafts)  # a root row repeats per branch, identically
    return out


def _logprobs(
    logits: torch.Tensor, seqs: list, glob: list[list[int]], ids: list[torch.Tensor], temperature: torch.Tensor
) -> list[list[float]]:
    """SGLang's logprob of every emitted token (0.0 for sequences that did not ask, as the plain step)."""
    want = [b for b, s in enumerate(seqs) if s.req.return_logprob]
    lps = [[0.0] * len(g) for g in glob]
    if want:
        rows = torch.tensor([r for b in want for r in glob[b]], device=logits.device)
        temp = torch.cat([temperature[b].expand(len(glob[b])) for b in want]).to(logits.device)
        picked = torch.cat([ids[b] for b in want])
        flat = sampler.token_logprobs(logits[rows], picked, temp).tolist()
        for b in want:
            lps[b], flat = flat[: len(glob[b])], flat[len(glob[b]) :]
    return lps


def _verify(logits, rows, drafts, lens, seqs, qs, prm, m_max: int, k: int):
    """Greedy rows by argmax; sampled rows by the point-mass / speculative-sampling rule. Same returns as
    verify_branches for all B rows."""
    ids = logits.argmax(-1)[rows]  # [B, M, k+1]
    branch, n_acc, out = verify_branches_greedy(drafts, lens, ids[:, 0, 0], ids[:, :, 1:])
    sampled = [b for b, s in enumerate(seqs) if s.req.params.temperature > 0]
    if not sampled:
        return branch, n_acc, out
    dev = drafts.device
    idx = torch.tensor(sampled, device=dev)
    pick = {key: v[sampled].repeat_interleave(m_max * (k + 1)).to(logits.device) for key, v in prm.items()}
    p = sampler.processed_probs(
        logits[rows[idx].reshape(-1)], pick["temperature"], pick["top_k"], pick["top_p"], pick["min_p"]
    )
    p = p.view(len(sampled), m_max, k + 1, -1)  # [S, M, k+1, V]
    point = torch.tensor([[qs[b][m] is None if m < len(qs[b]) else True for m in range(m_max)] for b in sampled])
    draft_q = None
    if not bool(point.all()):
        draft_q = p.new_zeros(len(sampled), m_max, k, p.shape[-1])  # [S, M, k, V]
        for j, b in enumerate(sampled):
            for m, q in enumerate(qs[b]):
                if q is not None:
                    draft_q[j, m, : q.shape[0]] = q
    b_s, n_s, out_s = verify_branches(
        drafts[idx], lens[idx], p[:, 0, 0], p[:, :, 1:], [seqs[b].generator for b in sampled], draft_q, point.to(dev)
    )
    branch, n_acc, out = branch.clone(), n_acc.clone(), out.clone()
    branch[idx], n_acc[idx], out[idx] = b_s, n_s, out_s
    return branch, n_acc, out
