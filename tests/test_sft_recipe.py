"""The bootstrap's SFT recipe (trainer.tasks.sft): focus weights, the weighted loss, the
lr schedule."""

from __future__ import annotations

import math

import pytest
import torch

from gleanrl.trainer.bootstrap import SIZES, PolicySize
from gleanrl.trainer.tasks import load_task
from gleanrl.trainer.tasks.base import Task
from gleanrl.trainer.tasks.builtin import build_char_tokenizer
from gleanrl.trainer.tasks.sft import _collate, lr_factor, make_batches, weighted_loss


def test_doubling_focus_is_the_first_lines_counter():
    task = load_task(None)
    for sample in task.prompts("train", 200, seed=3):
        solution = task.solution(sample)
        ((lo, hi),) = task.solution_focus(sample)
        if sample["steps"]:
            assert solution[lo:hi] == f"{sample['steps']:02d}"  # k, copied from the prompt
            assert solution.split("\n")[1].startswith(solution[lo:hi] + ":")
        else:
            assert solution[lo:hi] == "\\"  # k = 0: box the start at once


def test_batches_weigh_focus_tokens_and_nothing_outside_the_response():
    task, tok = load_task(None), build_char_tokenizer()
    size = PolicySize(
        hidden=8, layers=1, heads=2, kv_heads=2, intermediate=8, train_tokens=3000, batch_tokens=512, focus_weight=7.0
    )
    batches = make_batches(task, tok, size, seed=0)
    assert sum(b[0].numel() for b in batches) >= 3000
    for input_ids, labels, weights in batches:
        assert weights.shape == labels.shape == input_ids.shape
        assert torch.all((weights > 0) == (labels != -100))  # weight exactly where the loss is
        assert set(weights.unique().tolist()) <= {0.0, 1.0, 7.0}
        assert torch.all((weights == 7.0).sum(1) >= 1) and torch.all((weights == 7.0).sum(1) <= 2)
        for row in range(len(input_ids)):
            # the focus tokens spell the counter (or the box of k = 0)
            text = tok.decode(input_ids[row][weights[row] == 7.0].tolist())
            assert text == "\\" or (len(text) == 2 and text.isdigit())


def test_a_task_without_focus_weighs_every_label_one_and_bad_spans_are_refused():
    class Plain(Task):
        def prompts(self, split, n, seed):
            return [{"prompt": "q"}] * n

        def solution(self, sample):
            return "abc"

    class Bad(Plain):
        def solution_focus(self, sample):
            return [(2, 9)]

    size = PolicySize(
        hidden=8, layers=1, heads=2, kv_heads=2, intermediate=8, train_tokens=50, batch_tokens=64, focus_weight=5.0
    )
    tok = build_char_tokenizer()
    for _, labels, weights in make_batches(Plain(), tok, size, seed=0):
        assert torch.equal(weights, (labels != -100).float())
    with pytest.raises(ValueError, match="solution_focus"):
        make_batches(Bad(), tok, size, seed=0)


def test_weighted_loss_is_the_plain_loss_at_weight_one_and_leans_on_the_weighted_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    input_ids, labels, weights = _collate(
        [([1, 2, 3, 4, 5, 6], 2, [(1, 2)]), ([7, 8, 9], 1, [])], pad_id=0, focus_weight=1.0
    )
    plain = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))
    assert torch.allclose(weighted_loss(logits, labels, weights), plain)
    _, _, heavy = _collate([([1, 2, 3, 4, 5, 6], 2, [(1, 2)]), ([7, 8, 9], 1, [])], pad_id=0, focus_weight=1e6)
    # the focus token: label at 2 + 1
    nll = torch.nn.functional.cross_entropy(logits[0, 2], labels[0, 3])
    assert torch.allclose(weighted_loss(logits, labels, heavy), nll, atol=1e-4)


def test_lr_schedule_warms_up_then_decays_to_its_final_fraction():
    total = 200
    lrs = [lr_factor(i, total, warmup=0.05, final=0.05) for i in range(total)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0, abs=0.01)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(0.05, abs=1e-3) and max(lrs) <= 1.0
    old = [
        min((i + 1) / (total // 20), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, i / total))))
        for i in range(total)
    ]  # the version-1 recipe's schedule
    assert [lr_factor(i, total) for i in range(total)] == old


def test_a_size_at_the_old_recipe_keeps_its_version_1_cache_key(monkeypatch):
    import gleanrl.trainer.bootstrap as bootstrap

    current = bootstrap.SIZES["small"]
    # the key the shipped policy carries (gleanrl/shipped/*/bootstrap.json)
    assert bootstrap.cache_key(None, 0, "small")[1] == "c20b4d97e2d2"
    # with the later fields at their defaults (no polish phase), the key policies built before them
    # carry
    monkeypatch.setitem(
        bootstrap.SIZES, "small", PolicySize(**{**current.__dict__, "polish_steps": 0, "polish_focus_weight": 1.0})
    )
    assert bootstrap.cache_key(None, 0, "small")[1] == "cc935668cbf3"
    monkeypatch.setitem(
        bootstrap.SIZES,
        "small",
        PolicySize(**{**current.__dict__, "polish_steps": 0, "polish_focus_weight": 1.0, "focus_weight": 2.0}),
    )
    assert bootstrap.cache_key(None, 0, "small")[1] != "cc935668cbf3"


def test_sizes_validate_the_recipe_fields():
    assert SIZES["small"].focus_weight == 1
    with pytest.raises(ValueError, match="focus_weight"):
        PolicySize(hidden=8, layers=1, heads=2, kv_heads=2, intermediate=8, train_tokens=10, focus_weight=0)
    with pytest.raises(ValueError, match="warmup"):
        PolicySize(hidden=8, layers=1, heads=2, kv_heads=2, intermediate=8, train_tokens=10, warmup=1.0)


class _Oracle(torch.nn.Module):
    """Sees the whole input, so it 'predicts' each next token with margin `margin` (0: uniform)."""

    def __init__(self, vocab: int, margin: float):
        super().__init__()
        self.vocab, self.margin, self.w = vocab, margin, torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        from types import SimpleNamespace

        nxt = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float() * self.margin)


def test_reference_accuracy_is_the_probability_of_sampling_the_reference():
    from gleanrl.trainer.tasks.sft import reference_accuracy

    task, tok = load_task(None), build_char_tokenizer()
    samples = task.prompts("test", 12, seed=0)
    sure = reference_accuracy(_Oracle(len(tok), 60.0), tok, task, samples, batch_tokens=256)
    assert sure["expected"] == pytest.approx(1.0) and sure["greedy"] == 1.0 and sure["n"] == 12
    flat = reference_accuracy(_Oracle(len(tok), 0.0), tok, task, samples[:1], batch_tokens=256)
    n_response = len(task.solution(samples[0])) + 1  # and the end-of-turn token
    assert flat["expected"] == pytest.approx(len(tok) ** -n_response, rel=1e-3, abs=1e-4)


def test_bf16_autocast_only_where_bf16_is_native(monkeypatch):
    from gleanrl.harvest.train_step import bf16_fast

    assert bf16_fast("cuda")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not bf16_fast("cpu")  # an AVX2 host: emulated bf16, the recipe runs in float32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert bf16_fast("cpu")


def test_reference_accuracy_does_not_score_the_tasks_free_choices():
    from gleanrl.trainer.tasks.sft import reference_accuracy

    task, tok = load_task("doubling_checks"), build_char_tokenizer()
    sample = next(s for s in task.prompts("test", 50, seed=0) if s["checks"] >= 1)
    flat = reference_accuracy(_Oracle(len(tok), 0.0), tok, task, [sample], batch_tokens=4096)
    scored = len(task.solution(sample)) + 1 - len(task.solution_choices(sample))
    assert flat["expected"] == pytest.approx(len(tok) ** -scored, rel=1e-3)
    sure = reference_accuracy(_Oracle(len(tok), 60.0), tok, task, [sample], batch_tokens=4096)
    assert sure["greedy"] == 1.0 and sure["expected"] == pytest.approx(1.0)
