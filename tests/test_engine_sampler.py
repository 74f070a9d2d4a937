"""The sampler's pure functions: processed distributions, seeded draws, returned logprobs."""

from __future__ import annotations

import torch

from gleanrl.server.sampling.sampler import processed_probs, sample, token_logprobs


def _params(b, t=1.0, k=0, p=1.0, m=0.0):
    return (torch.full((b,), t), torch.full((b,), k, dtype=torch.long), torch.full((b,), p), torch.full((b,), m))


def test_processed_probs_filters():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert torch.allclose(processed_probs(logits, *_params(1)), torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert torch.allclose(processed_probs(logits, *_params(1, k=2)), torch.tensor([[2 / 3, 1 / 3, 0, 0]]))
    # top-p keeps the smallest prefix whose mass reaches p: 0.5 + 0.25 >= 0.7
    assert torch.allclose(processed_probs(logits, *_params(1, p=0.7)), torch.tensor([[2 / 3, 1 / 3, 0, 0]]))
    # min-p drops tokens below min_p * max = 0.25
    assert torch.allclose(processed_probs(logits, *_params(1, m=0.5)), torch.tensor([[2 / 3, 1 / 3, 0, 0]]))
    greedy = processed_probs(logits, *_params(1, t=0.0))
    assert greedy.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    hot = processed_probs(logits, *_params(1, t=0.5))
    expected = torch.softmax(logits / 0.5, -1)
    assert torch.allclose(hot, expected)


def test_rows_are_independent():
    logits = torch.randn(3, 50)
    t, k, p, m = torch.tensor([0.0, 0.8, 1.3]), torch.tensor([0, 5, 0]), torch.tensor([1.0, 1.0, 0.9]), torch.zeros(3)
    batch = processed_probs(logits, t, k, p, m)
    for i in range(3):
        row = processed_probs(logits[i : i + 1], t[i : i + 1], k[i : i + 1], p[i : i + 1], m[i : i + 1])
        assert torch.allclose(batch[i : i + 1], row)
    assert torch.allclose(batch.sum(-1), torch.ones(3))


def test_sample_seeded_and_distributed():
    probs = torch.tensor([[0.2, 0.3, 0.5]]).repeat(4000, 1)
    a = sample(probs[:5], [torch.Generator().manual_seed(1) for _ in range(5)])
    assert len(set(a.tolist())) == 1  # same seed, same draw
    draws = torch.cat([sample(probs[:1], [g]) for g in [torch.Generator().manual_seed(0)] for _ in range(4000)])
    freq = torch.bincount(draws, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.2, 0.3, 0.5]), atol=0.04)  # ~5 sigma at n=4000


def test_token_logprobs_convention():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1], [0.5, 0.25, 0.15, 0.1]]))
    ids = torch.tensor([1, 1])
    temperature = torch.tensor([0.0, 0.5])
    lp = token_logprobs(logits, ids, temperature)  # whatever top-p the request had
    # temperature applies, top-p does not (SGLang 0.5.23)
    hot = torch.softmax(logits[1] / 0.5, -1)[1]
    assert torch.allclose(lp, torch.stack([torch.log(torch.tensor(0.25)), hot.log()]))
