"""Weight pushes over a torch process group (SGLang's /init_weights_update_group, /update_weights_from_distributed,
/destroy_weights_update_group): the trainer is rank 0 and broadcasts each tensor; this server joins as rank
`rank_offset` (one TP rank) and receives them by the names, dtypes and shapes the update call lists. The group is made
as SGLang's `init_custom_process_group` makes it (a TCP rendezvous at master_address:master_port, a store prefixed with
the group name, no default group), so a trainer made for stock SGLang joins it unchanged. gloo on CPU; NCCL on CUDA."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=300)


def init_custom_process_group(
    backend: str, init_method: str, world_size: int, rank: int, group_name: str, timeout: timedelta = TIMEOUT
):
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), PrefixStore(group_name, store), group_name=group_name, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtypes: {name!r} is not a torch dtype")
    return dtype


def receive(
    pg,
    names: list[str],
    dtypes: list[str],
    shapes: list[list[int]],
    load_format: str | None,
    device: torch.device | str = "cpu",
) -> list[tuple[str, torch.Tensor]]:
    """The broadcast tensors from rank 0, in the listed order (`flattened_bucket`: one uint8 buffer
    holding them back to back, as SGLang's FlattenedTensorBucket)."""
    kinds = [dtype_of(d) for d in dtypes]
    if load_format == "flattened_bucket":
        sizes = [int(torch.Size(s).numel()) * torch.empty(0, dtype=k).element_size() for s, k in zip(shapes, kinds)]
        flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
        dist.broadcast(flat, src=0, group=pg)
        out, at = [], 0
        for name, kind, shape, size in zip(names, kinds, shapes, sizes):
            out.append((name, flat[at : at + size].view(kind).reshape(shape)))
            at += size
        return out
    out = []
    for name, kind, shape in zip(names, kinds, shapes):
        t = torch.empty(shape, dtype=kind, device=device)
        dist.broadcast(t, src=0, group=pg)
        out.append((name, t))
    return out


def destroy(pg) -> None:
    dist.destroy_process_group(pg)
