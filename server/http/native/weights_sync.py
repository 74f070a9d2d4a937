"""SGLang's in-memory weight sync: /update_weights_from_tensor (`server/weights/tensor_payload.py`), optionally inside a
/begin_weight_update ... /end_weight_update session that stages the calls (the process-group pushes of
`weights_group.py` too) and applies them as one atomic swap; memory release/resume."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictBool, StrictStr

from gleanrl.server.http.edge.body import parse
from gleanrl.server.weights import tensor_payload

log = logging.getLogger(__name__)
router = APIRouter()


class TensorUpdateIn(BaseModel):
    """SGLang's UpdateWeightsFromTensorReqInput (one payload per TP rank)."""

    serialized_named_tensors: list[StrictStr] = Field(min_length=1)
    load_format: StrictStr | None = None
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    selector: Literal["target", "draft"] = "target"


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
