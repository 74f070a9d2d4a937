"""Capture: aux hidden states equal transformers' output_hidden_states at the chosen layers;
soft labels."""

from __future__ import annotations

import pytest
import torch

from gleanrl.harvest.capture import capture


@pytest.fixture(scope="module")
def target(tiny_qwen2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()


@pytest.mark.parametrize("layer_ids", [[0, 1, 2], [-1, 0, 2]])
def test_capture_equals_output_hidden_states(target, layer_ids):
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 300, (n,), generator=g) for n in (9, 5, 7)]
    samples = capture(target, seqs, layer_ids, topk=8, prompt_lens=[3, 2, 4], policy_version=7)
    for seq, s in zip(seqs, samples):
        with torch.no_grad():
            out = target(input_ids=seq[None], output_hidden_states=True)
        # entering layer a+1
        want = torch.cat([out.hidden_states[a + 1][0] for a in layer_ids], dim=-1)
        assert s.aux_hidden.shape == (len(seq), 3 * target.config.hidden_size)
        torch.testing.assert_close(s.aux_hidden, want, atol=1e-5, rtol=1e-4)
        probs = torch.softmax(out.logits[0], -1)
        top_p, top_i = probs.topk(8, -1)
        # row j predicts token j+1
        assert torch.equal(s.topk_ids, top_i)
        torch.testing.assert_close(s.topk_probs, top_p)
        assert torch.equal(s.input_ids, seq) and s.policy_version == 7
    assert samples[0].loss_mask.tolist() == [False] * 3 + [True] * 6


def test_capture_batch_tensor_and_full_distribution(target):
    ids = torch.randint(0, 300, (2, 6))
    samples = capture(target, ids, [0, 1, 2], topk=None)
    assert samples[0].topk_ids.shape == (6, target.config.vocab_size)
    torch.testing.assert_close(samples[1].topk_probs.sum(-1), torch.ones(6))


def test_capture_rejects_bad_layer_ids(target):
    with pytest.raises(ValueError, match="increasing"):
        capture(target, torch.zeros(1, 3, dtype=torch.long), [2, 1, 0])
    with pytest.raises(ValueError, match="out of range"):
        capture(target, torch.zeros(1, 3, dtype=torch.long), [0, 1, 3])
