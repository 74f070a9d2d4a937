"""`F.linear` with its weight pre-packed by oneDNN where as exact and faster.

On a CPU with AVX-512 BF16 / AMX, torch's bf16 `linear` re-lays the weight out for oneDNN on every call; pre-packed (as
inductor's freezing pass does) a decode step's small-batch matmuls take about half the time (on this project's 2-core
machine: 27 vs 64 us for 512 -> 1536 at batch 1, 46 vs 77 us at 32). The results are bit-identical to `F.linear`
(checked once per process on a probe; else no packing), so greedy outputs and logprobs do not change. The packed copy
doubles the weights' memory: a cap.

fp32 is left to MKL: packing it is neither faster at batch 1 nor bit-identical. Its layout matters instead: a decode
step's matmul of a few rows against a weight held [out, in] runs MKL's transposed gemv / small-M sgemm, against one held
[in, out] the plain one, which streams the weight faster. The fused q/k/v and gate/up weights (out 3-4x in) are held
transposed in float32 (`transposed_layout`; the same values, a transposed view, so in-place updates still reach them).
On the AVX2-only host, 1 thread, a [768, 256] weight: 58 against 97 us at 1 row, 111 against 164 at 5, 136 against 161
at 8 (slower at 16: 244 against 207, faster again at 64); [1024, 256] 1.2-1.8x faster at 1-64 rows; for weights no
wider out than in (o_proj, down) it is slower at 1 row, so those stay. The sums run in another order: outputs move by
~1e-5 (float32 rounding), as they do between batch sizes anyway. docs/engine.md has the measurements."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

PACK_MAX_BYTES = 2 << 30  # weights of all packed linears together; beyond, plain F.linear


@functools.cache
def _packing_is_identical() -> bool:
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(96, 64, generator=g).bfloat16()
        x = torch.randn(3, 64, generator=g).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        return torch.equal(torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), F.linear(x, w))
    except (AttributeError, RuntimeError):
        return False


def can_pack(weights: list[torch.Tensor]) -> bool:
    """Whether `linear` would pack these weights (bf16 on the CPU, oneDNN there, within the cap)."""
    return (
        all(w.device.type == "cpu" and w.dtype == torch.bfloat16 for w in weights)
        and torch.backends.mkldnn.is_available()
        and sum(w.numel() * w.element_size() for w in weights) <= PACK_MAX_BYTES
        and _packing_is_identical()
    )


def linear(weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [N, in] -> x @ weight.T + bias [N, out]."""
    if not pack:
        return lambda x: F.linear(x, weight, bias)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def transposed_layout(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the fused q/k/v and gate/up weights are held [in, out] in memory (`harvest.drafter.fuse_linears`)."""
    return dtype == torch.float32 and device.type == "cpu"
