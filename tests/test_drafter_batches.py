"""Length-bucketed drafter training batches: every sample once per epoch, within the
token budget."""

import torch

from gleanrl.harvest.train_step import length_batches


def test_length_batches_cover_each_index_once_within_budget():
    lengths = [5, 300, 40, 41, 39, 800, 7, 8, 120, 60] * 3
    batches = length_batches(lengths, max_tokens=256, max_seqs=4, generator=torch.Generator().manual_seed(0))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) <= 4
        assert len(b) == 1 or len(b) * longest <= 256  # a sequence over budget goes alone
    assert any(len(b) > 1 for b in batches)


def test_length_batches_are_shuffled_by_the_generator():
    lengths = list(range(1, 200))
    a = length_batches(lengths, 64, 8, torch.Generator().manual_seed(0))
    b = length_batches(lengths, 64, 8, torch.Generator().manual_seed(1))
    assert a != b and sorted(map(sorted, a)) == sorted(map(sorted, b))
