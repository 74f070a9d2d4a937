"""SGLang's process-group weight push: /init_weights_update_group joins the trainer's group (loopback
and `--dist-allow` hosts only), /update_weights_from_distributed receives the broadcast and applies it
like a tensor update (`weights_sync.stage_or_apply`), /destroy_weights_update_group leaves it. Unknown
dtypes, or more tensors or elements than the model holds, are refused before any buffer is allocated;
once receiving starts it runs to the end (names and shapes are checked after, as SGLang), so the
trainer's broadcasts complete and the stream stays aligned even when the tensors are refused."""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

from gleanrl.server.config import is_loopback
from gleanrl.server.http.edge.body import parse
from gleanrl.server.http.native.weights_sync import answer, stage_or_apply
from gleanrl.server.weights import process_group

log = logging.getLogger(__name__)
router = APIRouter()


class InitGroupIn(BaseModel):  # SGLang's InitWeightsUpdateGroupReqInput
    master_address: StrictStr
    master_port: StrictInt
    rank_offset: StrictInt
    world_size: StrictInt = Field(ge=2)
    group_name: StrictStr = "weight_update_group"
    backend: Literal["gloo", "nccl"] = "nccl"


class DistributedUpdateIn(BaseModel):  # SGLang's UpdateWeightsFromDistributedReqInput
    names: list[StrictStr] = Field(min_length=1)
    dtypes: list[StrictStr]
    shapes: list[list[StrictInt]]
    group_name: StrictStr = "weight_update_group"
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    load_format: StrictStr | None = None
    selector: Literal["target", "draft"] = "target"


class DestroyGroupIn(BaseModel):
    group_name: StrictStr = "weight_update_group"


@router.post("/init_weights_update_group")
async def init_weights_update_group(request: Request):
    state = request.app.state
    body = await parse(request, InitGroupIn)
    groups = state.weight_groups
    if body.group_name in groups:
        return answer(False, f"group {body.group_name!r} already exists; destroy it first")
    if not 1 <= body.rank_offset < body.world_size:
        return answer(False, f"rank_offset must be in [1, world_size): the trainer is rank 0, got {body.rank_offset}")
    if not (is_loopback(body.master_address) or body.master_address in state.server_cfg.dist_allow):
        why = "only loopback addresses and the hosts given with --dist-allow may be joined"
        return answer(False, f"master_address {body.master_address!r} is not allowed: {why}")
    if not 0 < body.master_port < 65536:
        return answer(False, f"master_port must be in [1, 65535], got {body.master_port}")
    if body.backend == "nccl" and state.engine.cfg.device != "cuda":
        return answer(False, "backend 'nccl' needs a CUDA server; this one runs on the CPU: use 'gloo'")
    if state.group_joining.locked():  # a rendezvous holds a worker thread until it times out: one at a time
        return answer(False, "another /init_weights_update_group is waiting for its rendezvous; retry after it")
    try:
        async with state.group_joining:
            groups[body.group_name] = await asyncio.to_thread(
                process_group.init_custom_process_group,
                body.backend,
                f"tcp://{body.master_address}:{body.master_port}",
                body.world_size,
                body.rank_offset,
                body.group_name,
            )
    except Exception as exc:  # rendezvous timeout, refused connection, a bad address
        return answer(False, f"Failed to initialize custom process group: {exc}.")
    return answer(True, "Succeeded to initialize custom process group.")


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(request: Request):
    state = request.app.state
    body = await parse(request, DistributedUpdateIn)
    pg = state.weight_groups.get(body.group_name)
    if pg is None:
        groups = list(state.weight_groups)
        return answer(False, f"Group {body.group_name} not in {groups}. Please call `init_weights_update_group` first.")
    if not len(body.names) == len(body.dtypes) == len(body.shapes):
        return answer(False, "names, dtypes and shapes must have the same length")
    try:
        state.engine.check_tensor_list(body.selector, body.names, body.shapes)
        for d in body.dtypes:
            process_group.dtype_of(d)
    except ValueError as exc:
        log.warning("distributed weight update refused before receiving: %s", exc)
        return answer(False, str(exc))
    try:
        named = await asyncio.to_thread(
            process_group.receive, pg, body.names, body.dtypes, body.shapes, body.load_format, state.engine.cfg.device
        )
        return await stage_or_apply(state, named, body)
    except (ValueError, RuntimeError) as exc:  # CheckpointError, a bad dtype, a broken group
        log.warning("distributed weight update refused: %s", exc)
        return answer(False, str(exc))


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(request: Request):
    state = request.app.state
    body = await parse(request, DestroyGroupIn)
    pg = state.weight_groups.pop(body.group_name, None)
    if pg is None:
        return answer(False, f"group {body.group_name!r} does not exist")
    await asyncio.to_thread(process_group.destroy, pg)
    return answer(True, "Succeeded to destroy custom process group.")
