"""A two-branch draft tree in one target pass scores each branch exactly as a chain pass would, and
keeping the accepted path leaves a cache that decodes on as if only that path had been fed."""

from __future__ import annotations

import pytest
import torch

from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.sd.tree_pass import build_tree, keep_path


def _prefill(runner: ModelRunner, prompt: list[int], pooled=None):
    cache = pooled or runner.new_cache(capacity=8)
    runner.forward(torch.tensor(prompt[:-1]), torch.arange(len(prompt) - 1), [cache], [len(prompt) - 1])
    return cache


def _chain_logits(runner, prompt, branch):
    cache = _prefill(runner, prompt)
    ids = prompt[-1:] + branch
    logits, aux = runner.forward(
        torch.tensor(ids),
        torch.arange(len(prompt) - 1, len(prompt) + len(branch)),
        [cache],
        [len(ids)],
        capture_layers=[0, 1],
        last_only=False,
    )
    return logits, aux


@pytest.mark.parametrize("accept", [(0, 2), (1, 3), (1, 0), (-1, 0)])
def test_tree_pass_equals_chain_passes_and_keeps_the_accepted_path(tiny_qwen2, accept):
    runner = ModelRunner.load(str(tiny_qwen2))
    prompt, branches = [5, 17, 33, 2, 9, 40], [[11, 12, 13], [11, 30, 31, 32]]  # same first token
    # a second sequence
    other = runner.new_cache(capacity=8)
    cache = _prefill(runner, prompt)
    _prefill(runner, prompt[:4], other)
    start = cache.length
    tree = build_tree(prompt[-1], start, branches)
    tokens = tree.tokens + [prompt[3]]
    positions = tree.positions + [other.length]
    logits, aux = runner.forward(
        torch.tensor(tokens),
        torch.tensor(positions),
        [cache, other],
        [tree.size, 1],
        capture_layers=[0, 1],
        last_only=False,
        tree_masks=[tree.mask(), None],
    )
    for m, b in enumerate(branches):
        want, want_aux = _chain_logits(runner, prompt, b)
        rows = tree.branch_rows(m)
        torch.testing.assert_close(logits[rows], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(aux[rows], want_aux, rtol=1e-5, atol=1e-5)
    branch, n = accept
    keep_path(cache, start, tree.rows(branch, n))
    path = prompt + (branches[branch][:n] if branch >= 0 else [])
    assert cache.length == len(path)
    nxt, _ = runner.forward(torch.tensor([7]), torch.tensor([len(path)]), [cache], [1])
    ref = _prefill(runner, path + [7])
    want, _ = runner.forward(torch.tensor([7]), torch.tensor([len(path)]), [ref], [1])
    assert ref.length == cache.length
    torch.testing.assert_close(nxt, want, rtol=1e-5, atol=1e-5)


def test_tree_mask_sees_the_root_and_its_own_branch_only():
    tree = build_tree(1, 10, [[2, 3], [4]])
    assert tree.tokens == [1, 2, 3, 4] and tree.positions == [10, 11, 12, 11] and tree.offsets == [1, 3]
    assert tree.mask().int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    assert tree.rows(1, 1) == [0, 3] and tree.rows(0, 2) == [0, 1, 2] and tree.rows(-1, 0) == [0]
