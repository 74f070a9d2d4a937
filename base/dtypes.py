"""Which safetensors dtypes a checkpoint may change on a weight update (one rule for the server's
loader and the pusher's header check)."""

from __future__ import annotations

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})  # cast to the serving dtype at load


def fits(shape: tuple[int, ...], dtype: str, ref_shape: tuple[int, ...], ref_dtype: str) -> bool:
    """A tensor of (shape, dtype) may replace one of (ref_shape, ref_dtype): the same shape, and the
    same dtype unless both are floating point (cast at load, by SGLang as by gleanrl)."""
    return tuple(shape) == tuple(ref_shape) and (dtype == ref_dtype or {dtype, ref_dtype} <= FLOAT_DTYPES)
