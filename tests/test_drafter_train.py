"""TTT training: alignment, unroll == the engine's cached draft chain, loss falls and
acceptance rises."""

from __future__ import annotations

import pytest
import torch

from gleanrl.harvest.capture import capture
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.train_step import (
    accept_lengths,
    acceptance_length,
    collate,
    draft_labels,
    expected_accept_lengths,
    make_optimizer,
    train_step,
    ttt_loss,
    ttt_unroll,
)
from gleanrl.server.sd.drafter_forward import drafter_forward, new_draft_cache


@pytest.fixture(scope="module")
def target(tiny_qwen2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def greedy_samples(target):
    """Greedy continuations of random prompts: deterministic in their context, so learnable."""
    torch.manual_seed(0)
    prompts = torch.randint(0, 300, (24, 4))
    out = target.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        do_sample=False,
        max_new_tokens=40,
        pad_token_id=0,
        eos_token_id=None,
    )
    return [s.tensors() for s in capture(target, out, [0, 1, 2], topk=None, prompt_lens=[4] * 24)]


def test_unroll_equals_sequential_cached_drafting(tiny_qwen2):
    """Step s of the TTT unroll at slot i == drafting s+1 tokens after slot i with the
    ragged KV cache."""
    d = init_drafter(tiny_qwen2, seed=1).eval()
    g = torch.Generator().manual_seed(0)
    T, steps = 7, 3
    ids, aux = torch.randint(0, 300, (1, T), generator=g), torch.randn(1, T, 3 * d.config.hidden_size, generator=g)
    with torch.no_grad():
        unrolled = ttt_unroll(d, ids, aux, torch.ones(1, T, dtype=torch.bool), steps)
        for i in range(T - steps - 1):
            cache = new_draft_cache(d)
            # slots 0..i: (target hidden h_j, token j+1) at position j
            h = drafter_forward(d, ids[0, 1 : i + 2], aux[0, : i + 1], torch.arange(i + 1), [cache], [i + 1])[-1:]
            torch.testing.assert_close(d.draft_logits(h)[0], unrolled[0][0, i], atol=1e-5, rtol=1e-4)
            for s in range(1, steps):  # feed the drafter's own pre-norm output with the next token
                h = drafter_forward(d, ids[0, i + s + 1 : i + s + 2], h, torch.tensor([i + s]), [cache], [1])
                torch.testing.assert_close(d.draft_logits(h)[0], unrolled[s][0, i], atol=1e-5, rtol=1e-4)


def test_alignment_labels_predict_token_i_plus_s_plus_2(tiny_qwen2):
    """With a perfect target (label row j = one-hot of token j+1), step s at slot i is scored on
    token i+s+2."""
    d = init_drafter(tiny_qwen2, seed=0)
    T, V = 10, d.config.vocab_size
    ids = torch.randint(0, 300, (T,))
    probs = torch.zeros(T, V)
    probs[torch.arange(T - 1), ids[1:]] = 1.0
    sample = {"input_ids": ids, "aux_hidden": torch.randn(T, 3 * d.config.hidden_size), "target_probs": probs}
    b = collate([sample], d)
    logits = []
    for s in range(3):  # a drafter that always drafts token i+s+2 exactly
        lg = torch.full((1, T, V), -30.0)
        i = torch.arange(T - s - 2)
        lg[0, i, ids[i + s + 2]] = 30.0
        logits.append(lg)
    loss, metrics = ttt_loss(logits, b["labels"], b["valid"], b["loss_mask"])
    assert loss < 1e-3 and all(metrics[f"acc_{s}"] == 1.0 for s in range(3))
    shifted = [torch.roll(lg, 1, dims=1) for lg in logits]  # off by one position: must score badly
    assert ttt_loss(shifted, b["labels"], b["valid"], b["loss_mask"])[0] > 10
    starts = torch.ones(1, T, dtype=torch.bool)
    lengths = accept_lengths(logits, b["ids"], starts, d.draft_to_target())
    # all 3 drafts accepted + bonus where the sequence allows
    assert lengths[: T - 4].tolist() == [4.0] * (T - 4)
    expected = expected_accept_lengths(logits, b["labels"], starts)
    torch.testing.assert_close(expected[: T - 4], torch.full((T - 4,), 4.0), atol=1e-4, rtol=0)
    # alpha = 1/V per step
    uniform = expected_accept_lengths([torch.zeros(1, T, V)] * 3, b["labels"], starts)
    torch.testing.assert_close(uniform[0], torch.tensor(1 + 1 / V + 1 / V**2 + 1 / V**3))


def test_topk_and_dense_labels_agree(greedy_samples, tiny_qwen2):
    d = init_drafter(tiny_qwen2)
    s = greedy_samples[0]
    dense = torch.zeros(len(s["input_ids"]), d.config.vocab_size).scatter(1, s["topk_ids"], s["topk_probs"])
    torch.testing.assert_close(draft_labels(s, d), draft_labels({"target_probs": dense}, d))


def test_ttt_steps_reduce_loss_and_raise_heldout_acceptance(greedy_samples, tiny_qwen2):
    torch.manual_seed(0)
    d = init_drafter(tiny_qwen2, seed=0, aux_layer_ids=[0, 1, 2])
    train, held = greedy_samples[:20], greedy_samples[20:]
    before = acceptance_length(d, held, k=4)
    sampled_before = acceptance_length(d, held, k=4, mode="sampled")
    b = collate(train, d)
    with torch.no_grad():
        loss_before = ttt_loss(
            ttt_unroll(d, b["ids"], b["aux"], b["valid"], 4), b["labels"], b["valid"], b["loss_mask"]
        )[0]
    opt = make_optimizer(d, lr=3e-3)
    for step in range(40):
        metrics = train_step(d, opt, [train[(4 * step + i) % 20] for i in range(4)])
    assert set(metrics) >= {"loss", "loss_0", "acc_0", "acc_3", "tokens"}
    with torch.no_grad():
        loss_after = ttt_loss(
            ttt_unroll(d, b["ids"], b["aux"], b["valid"], 4), b["labels"], b["valid"], b["loss_mask"]
        )[0]
    after = acceptance_length(d, held, k=4)
    assert loss_after < loss_before - 0.05
    assert after > before + 0.15, (before, after)
    assert acceptance_length(d, held, k=4, mode="sampled") > sampled_before
