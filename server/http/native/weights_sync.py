"""SGLang's in-memory weight sync: /update_weights_from_tensor (`server/weights/tensor_payload.py`) and the
process-group push (/init_weights_update_group joins the trainer's group, loopback and `--dist-allow` hosts only;
/update_weights_from_distributed; /destroy_weights_update_group), optionally inside a /begin_weight_update ...
/end_weight_update session that stages them and applies one atomic swap; memory release/resume. A broadcast with
unknown dtypes, or more tensors or elements than the model holds, is refused before any buffer is allocated; once
receiving starts it runs to the end (names and shapes checked after, as SGLang), the trainer's stream kept aligned."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

from gleanrl.server.config import is_loopback
from gleanrl.server.http.edge.body import parse
from gleanrl.server.weights import process_group, tensor_payload

log = logging.getLogger(__name__)
router = APIRouter()


class UpdateIn(BaseModel):
    """The fields every SGLang weight update shares (gleanrl's `selector`)."""

    load_format: StrictStr | None = None
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    selector: Literal["target", "draft"] = "target"


class TensorUpdateIn(UpdateIn):
    """SGLang's UpdateWeightsFromTensorReqInput (one payload per TP rank)."""

    serialized_named_tensors: list[StrictStr] = Field(min_length=1)


class InitGroupIn(BaseModel):  # SGLang's InitWeightsUpdateGroupReqInput
    master_address: StrictStr
    master_port: StrictInt
    rank_offset: StrictInt
    world_size: StrictInt = Field(ge=2)
    group_name: StrictStr = "weight_update_group"
    backend: Literal["gloo", "nccl"] = "nccl"


class DistributedUpdateIn(UpdateIn):  # SGLang's UpdateWeightsFromDistributedReqInput
    names: list[StrictStr] = Field(min_length=1)
    dtypes: list[StrictStr]
    shapes: list[list[StrictInt]]
    group_name: StrictStr = "weight_update_group"


class DestroyGroupIn(BaseModel):
    group_name: StrictStr = "weight_update_group"


class BeginWeightUpdateIn(BaseModel):
    selector: Literal["target", "draft"] = "target"


class MemoryTagsIn(BaseModel):
    tags: list[StrictStr] | None = None


@dataclass
class Session:
    selector: str
    named: dict = field(default_factory=dict)  # by name: a tensor sent twice is staged once
    version: str | None = None
    flush_cache: bool = True
    abort: bool = False


def answer(ok: bool, message: str) -> JSONResponse:
    return JSONResponse({"success": ok, "message": message}, status_code=200 if ok else 400)


async def apply(state, *args) -> None:
    """`engine.update_weights(*args)` under the weights lock, off the event loop."""
    async with state.weights_lock:
        await asyncio.to_thread(state.engine.update_weights, *args)


@router.post("/begin_weight_update")
async def begin_weight_update(request: Request):
    state = request.app.state
    body = await parse(request, BeginWeightUpdateIn)
    if state.weight_session is not None:
        return answer(False, "a weight-update session is already open; send /end_weight_update first")
    state.weight_session = Session(body.selector)
    return answer(True, f"Weight update session opened for {body.selector}.")


@router.post("/update_weights_from_tensor")
async def update_weights_from_tensor(request: Request):
    state = request.app.state
    body = await parse(request, TensorUpdateIn)
    try:
        handles = state.server_cfg.local_tensor_handles
        named = await asyncio.to_thread(tensor_payload.decode, body.serialized_named_tensors, body.load_format, handles)
        return await stage_or_apply(state, named, body)
    except ValueError as exc:  # CheckpointError too: refused, the old weights keep serving
        log.warning("tensor weight update refused: %s", exc)
        return answer(False, str(exc))


async def stage_or_apply(state, named: list, body) -> JSONResponse:
    """Check `named` completely; then stage it inside a session, else apply it now. `body`: selector,
    weight_version, flush_cache, abort_all_requests. ValueError (CheckpointError) when refused."""
    session: Session | None = state.weight_session
    if session is not None and body.selector != session.selector:
        return answer(False, f"selector {body.selector!r} differs from the open session's {session.selector!r}")
    # every check before the weights lock and the engine, off the event loop: a refused update
    # costs running requests nothing (and a staged one is refused now, not at the end)
    await asyncio.to_thread(state.engine.check_tensors, body.selector, named)
    if session is not None:
        session.named.update(named)
        session.version = body.weight_version if body.weight_version is not None else session.version
        session.flush_cache, session.abort = body.flush_cache, session.abort or body.abort_all_requests
        return answer(True, f"Staged {len(named)} tensors; /end_weight_update applies them.")
    await apply(state, named, body.weight_version, body.selector, body.flush_cache, body.abort_all_requests)
    return answer(True, "Succeeded to update model weights.")


@router.post("/end_weight_update")
async def end_weight_update(request: Request):
    state = request.app.state
    session: Session | None = state.weight_session
    state.weight_session = None
    if session is None:
        return answer(False, "no weight-update session is open")
    if not session.named:
        return answer(True, "Weight update session closed; nothing was staged.")
    try:
        await apply(
            state, list(session.named.items()), session.version, session.selector, session.flush_cache, session.abort
        )
    except ValueError as exc:
        log.warning("staged tensor weight update refused: %s", exc)
        return answer(False, str(exc))
    return answer(True, f"Succeeded to update model weights ({len(session.named)} tensors).")


async def _memory_call(request: Request, action: str, done: str):
    state = request.app.state
    body = await parse(request, MemoryTagsIn)
    try:
        await asyncio.to_thread(getattr(state.engine, action), body.tags)
    except ValueError as exc:
        return answer(False, str(exc))
    return answer(True, done)


# one route per method: each gets its own OpenAPI operation id
@router.get("/release_memory_occupation")
@router.post("/release_memory_occupation")
async def release_memory_occupation(request: Request):
    return await _memory_call(request, "release_memory", "Memory released.")


@router.get("/resume_memory_occupation")
@router.post("/resume_memory_occupation")
async def resume_memory_occupation(request: Request):
    return await _memory_call(request, "resume_memory", "Memory resumed.")


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
