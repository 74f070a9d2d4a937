"""SGLang's `serialized_named_tensors` (POST /update_weights_from_tensor): per TP rank, base64 of a pickle of [(name,
tensor)] (or, with `load_format: "flattened_bucket"`, of {"flattened_tensor", "metadata"}). Tensors travel by value (a
plain pickle); ForkingPickler fd / shared-memory handles (a trainer on the same host) only with `local_handles`
(`gleanrl serve --local-tensor-handles`): a handle makes the server connect to, or map, what the sender names. Unpickled
with an allowlist, as SGLang 0.5.23's `SafeUnpickler`: torch's tensor and storage rebuilders, torch dtypes and Size,
basic containers; anything else is refused (a pickle can otherwise run code). Storages may not declare more bytes than
the payload carries and may not be compressed, so a small payload cannot inflate. Anything odd is a ValueError (400).
One server process is TP rank 0: it reads the first payload."""

from __future__ import annotations

import base64
import io
import pickle
import zipfile
from dataclasses import dataclass

import torch

BUILTINS = ("bool", "dict", "float", "int", "list", "set", "slice", "str", "tuple", "frozenset", "complex")
ALLOWED = (
    {("builtins", n) for n in BUILTINS}
    | {("torch", n) for n in ("Size", "Tensor", "UntypedStorage")}
    | {("torch._utils", n) for n in ("_rebuild_tensor_v2", "_rebuild_tensor", "_rebuild_parameter")}
    | {("torch.storage", n) for n in ("TypedStorage", "UntypedStorage")}
    | {("copyreg", "__newobj__"), ("copyreg", "_reconstructor"), ("collections", "OrderedDict")}
    | {("torch._tensor", "_rebuild_from_type_v2"), ("torch.nn.parameter", "Parameter")}
)
HANDLES = {
    ("torch.multiprocessing.reductions", n)
    for n in ("rebuild_tensor", "rebuild_storage_fd", "rebuild_storage_filename", "rebuild_typed_storage")
} | {("multiprocessing.resource_sharer", "DupFd")}
STORAGES = {
    f"{k}Storage" for k in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
}
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


def _from_value(kind: type):
    """bytes / bytearray from a value, never from a count (bytes(10**12) would allocate it)."""

    def build(*args):
        if any(isinstance(a, int) for a in args):
            raise pickle.UnpicklingError("bytes from a count are not allowed in serialized_named_tensors")
        return kind(*args)

    return build


def _load_storage(data: bytes):
    """A storage, unless it declares more bytes than `data` carries or is compressed."""
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if any(i.compress_type != zipfile.ZIP_STORED for i in z.infolist()):
                raise ValueError("compressed storages are not allowed in serialized_named_tensors")
    else:
        f, sizes = io.BytesIO(data), {}
        for _ in range(4):  # magic number, protocol version, system info, the object
            _Header(f, sizes).load()
        if sum(sizes.values()) > len(data):
            raise ValueError(f"a storage declares {sum(sizes.values())} bytes but its record holds {len(data)}")
    return torch.load(io.BytesIO(data), weights_only=True)


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, local_handles: bool = False):
        super().__init__(f)
        self.local_handles = local_handles

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _load_storage
        if (module, name) == BUCKET_META:
            return BucketEntry
        if (module, name) in (("builtins", "bytes"), ("builtins", "bytearray")):
            return _from_value(bytes if name == "bytes" else bytearray)
        if (module, name) in ALLOWED or (
            module == "torch" and (name in STORAGES or isinstance(getattr(torch, name, None), torch.dtype))
        ):
            return super().find_class(module, name)
        if (module, name) in HANDLES:
            if self.local_handles:
                return super().find_class(module, name)
            raise pickle.UnpicklingError(
                f"{module}.{name} is a same-host handle; this server takes tensors by value only (start it with "
                "--local-tensor-handles for a local trainer)"
            )
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in serialized_named_tensors")


class _Header(_Unpickler):
    """Reads a legacy torch.save stream's pickles without building storages: records their declared sizes."""

    def __init__(self, f, sizes: dict):
        super().__init__(f)
        self.sizes = sizes

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage" or not isinstance(pid[4], int):
            raise pickle.UnpicklingError("a storage record of an unknown shape")
        dtype = getattr(pid[1], "_dtype", None) or torch.uint8  # a legacy typed storage class, or untyped
        self.sizes[pid[2]] = pid[4] * torch.empty((), dtype=dtype).element_size()
        return None


def decode(payloads: list[str], load_format: str | None, local_handles: bool = False) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of the first (rank 0) payload; ValueError naming what is wrong."""
    if not payloads:
        raise ValueError("serialized_named_tensors is empty")
    if load_format not in (None, "direct", "flattened_bucket"):
        raise ValueError(f"load_format {load_format!r} is not supported (None, 'direct' or 'flattened_bucket')")
    try:
        obj = _Unpickler(io.BytesIO(base64.b64decode(payloads[0], validate=True)), local_handles).load()
        return _named(obj, load_format)
    except Exception as exc:
        # a pickle can raise anything from its rebuilders: all of it is a bad payload
        raise ValueError(f"serialized_named_tensors could not be decoded: {type(exc).__name__}: {exc}"[:500]) from None


def _named(obj, load_format: str | None) -> list[tuple[str, torch.Tensor]]:
    if load_format == "flattened_bucket":
        if not isinstance(obj, dict) or not {"flattened_tensor", "metadata"} <= set(obj):
            raise ValueError("a flattened_bucket payload is a dict with flattened_tensor and metadata")
        flat, meta = obj["flattened_tensor"], obj["metadata"]
        if not isinstance(flat, torch.Tensor) or not all(isinstance(m, BucketEntry) for m in meta):
            raise ValueError("a flattened_bucket payload holds a tensor and FlattenedTensorMetadata records")
        return [(m.name, flat[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape)) for m in meta]
    if not isinstance(obj, (list, tuple)) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], torch.Tensor)
        for p in obj
    ):
        raise ValueError("serialized_named_tensors must hold a list of (name, tensor) pairs")
    return [(n, t) for n, t in obj]
