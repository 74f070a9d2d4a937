"""SGLang's `serialized_named_tensors` (POST /update_weights_from_tensor): per TP rank, base64 of a pickle
of [(name, tensor)] (or, with `load_format: "flattened_bucket"`, of {"flattened_tensor", "metadata"}).
Tensors travel by value (a plain pickle) or, from a process on the same host, as ForkingPickler CPU
shared-memory handles. Unpickled with an allowlist, as SGLang 0.5.23's `SafeUnpickler`: torch's tensor
and storage rebuilders, torch dtypes and Size, basic containers; anything else is refused (a pickle can
otherwise run code). One server process is TP rank 0: it reads the first payload."""
from __future__ import annotations

import base64
import binascii
import io
import pickle
from dataclasses import dataclass

import torch

ALLOWED = {("builtins", n) for n in ("bool", "bytearray", "bytes", "dict", "float", "int", "list", "set", "slice",
                                     "str", "tuple", "frozenset", "complex", "range")} | {
    ("collections", "OrderedDict"), ("copyreg", "__newobj__"), ("copyreg", "_reconstructor"), ("torch", "Size"),
    ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_parameter"),
    ("torch._tensor", "_rebuild_from_type_v2"), ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"),
    ("torch.multiprocessing.reductions", "rebuild_tensor"), ("torch.multiprocessing.reductions", "rebuild_storage_fd"),
    ("torch.multiprocessing.reductions", "rebuild_storage_filename"),
    ("torch.multiprocessing.reductions", "rebuild_typed_storage"), ("torch.storage", "TypedStorage"),
    ("torch.storage", "UntypedStorage"), ("torch", "UntypedStorage"), ("multiprocessing.resource_sharer", "DupFd")}
STORAGES = {"BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "DoubleStorage", "FloatStorage",
            "HalfStorage", "IntStorage", "LongStorage", "ShortStorage"}
BUCKET_META = ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata")


@dataclass
class BucketEntry:
    """Stands in for SGLang's `FlattenedTensorMetadata` (name, shape, dtype, start_idx, end_idx, numel)."""
    name: str = ""
    shape: tuple = ()
    dtype: torch.dtype = torch.float32
    start_idx: int = 0
    end_idx: int = 0
    numel: int = 0


def _load_storage(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _load_storage
        if (module, name) == BUCKET_META:
            return BucketEntry
        if (module, name) in ALLOWED or (module == "torch" and (name in STORAGES or
                                                                 isinstance(getattr(torch, name, None), torch.dtype))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in serialized_named_tensors")


def decode(payloads: list[str], load_format: str | None) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of the first (rank 0) payload; ValueError naming what is wrong."""
    if not payloads:
        raise ValueError("serialized_named_tensors is empty")
    if load_format not in (None, "direct", "flattened_bucket"):
        raise ValueError(f"load_format {load_format!r} is not supported (None, 'direct' or 'flattened_bucket')")
    try:
        obj = _Unpickler(io.BytesIO(base64.b64decode(payloads[0], validate=True))).load()
    except (binascii.Error, ValueError, pickle.UnpicklingError, EOFError, TypeError, RuntimeError) as exc:
        raise ValueError(f"serialized_named_tensors could not be decoded: {exc}") from None
    if load_format == "flattened_bucket":
        if not isinstance(obj, dict) or not {"flattened_tensor", "metadata"} <= set(obj):
            raise ValueError("a flattened_bucket payload is a dict with flattened_tensor and metadata")
        flat = obj["flattened_tensor"]
        return [(m.name, flat[m.start_idx:m.end_idx].view(m.dtype).reshape(m.shape)) for m in obj["metadata"]]
    if not isinstance(obj, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 and
                                                     isinstance(p[0], str) and isinstance(p[1], torch.Tensor)
                                                     for p in obj):
        raise ValueError("serialized_named_tensors must hold a list of (name, tensor) pairs")
    return [(n, t) for n, t in obj]
