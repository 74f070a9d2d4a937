"""The serving drafter (fused q/k/v and gate/up) computes what the training drafter computes."""

from __future__ import annotations

import copy

import pytest
import torch

from gleanrl.harvest.cli_init import init_drafter
from gleanrl.server.sd.drafter_forward import drafter_forward, new_draft_cache


@pytest.mark.parametrize("transposed", [False, True])
def test_fused_forward_equals_unfused(tiny_qwen2, transposed):
    plain = init_drafter(tiny_qwen2, seed=5).eval()
    fused = copy.deepcopy(plain).fuse_for_inference(transposed=transposed)
    assert (fused.fused[0].stride()[0] == 1) == transposed  # held [in, out]
    H3 = plain.fc.in_features
    gen = torch.Generator().manual_seed(0)
    ids, aux = torch.randint(0, plain.config.vocab_size, (7,), generator=gen), torch.randn(7, H3, generator=gen)
    with torch.no_grad():
        outs = []
        for d in (plain, fused):
            cache = new_draft_cache(d)
            h = drafter_forward(d, ids[:5], aux[:5], torch.arange(5), [cache], [5])  # catch-up
            # one draft step
            h2 = drafter_forward(d, ids[5:6], h[-1:], torch.tensor([5]), [cache], [1])
            outs.append((h, h2, d.logits(h2)))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the fused weights are the modules' weights: an in-place update reaches both
    with torch.no_grad():
        fused.midlayer.mlp.up_proj.weight.mul_(2)
        assert torch.equal(fused.fused[1][plain.config.intermediate_size :], fused.midlayer.mlp.up_proj.weight)


def test_packed_bf16_serving_drafter_is_bit_identical(tiny_qwen2):
    """The server's drafter matmuls (oneDNN-packed where that gives the same bits)
    change no draft."""
    from gleanrl.server.model.packed_linear import can_pack, linear

    plain = init_drafter(tiny_qwen2, seed=5).eval().to(torch.bfloat16)
    if not can_pack([plain.fc.weight]):
        pytest.skip("oneDNN packing is not available or not bit-identical on this CPU")
    unpacked = copy.deepcopy(plain).fuse_for_inference()
    packed = copy.deepcopy(plain).fuse_for_inference(lambda w: linear(w, None, True))
    H3 = plain.fc.in_features
    gen = torch.Generator().manual_seed(1)
    ids, aux = torch.randint(0, plain.config.vocab_size, (6,), generator=gen), torch.randn(6, H3, generator=gen)
    outs = []
    with torch.no_grad():
        for d in (unpacked, packed):
            cache = new_draft_cache(d)
            h = drafter_forward(d, ids[:5], aux[:5].bfloat16(), torch.arange(5), [cache], [5])
            h2 = drafter_forward(d, ids[5:6], h[-1:], torch.tensor([5]), [cache], [1])
            outs.append((h, h2, d.logits(h2)))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
