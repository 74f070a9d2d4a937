"""SGLang's native control API (its paths and answers): disk weight updates (gleanrl's `selector`),
health, cache flush, pause/continue, abort, Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, StrictBool, StrictStr

from gleanrl.server.engine import PAUSE_MODES
from gleanrl.server.http.edge.auth import check_admin
from gleanrl.server.http.edge.body import parse, read_json
from gleanrl.server.http.edge.errors import ApiError
from gleanrl.server.http.native.weights_sync import UpdateIn, apply
from gleanrl.server.protocol import GenerateRequest, SamplingParams

log = logging.getLogger(__name__)
router = APIRouter()
HEALTH_TIMEOUT_S = 20.0


class UpdateWeightsIn(UpdateIn):
    model_path: StrictStr


class AbortIn(BaseModel):
    rid: StrictStr = ""
    abort_all: StrictBool = False


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request):
    state = request.app.state
    body = await parse(request, UpdateWeightsIn)
    try:
        await apply(
            state, body.model_path, body.weight_version, body.selector, body.flush_cache, body.abort_all_requests
        )
    except Exception as exc:  # CheckpointError, or anything a bad checkpoint raises: refuse, keep serving
        log.warning("weight update from %s refused: %s", body.model_path, exc)
        message = str(exc) or type(exc).__name__
        return JSONResponse({"success": False, "message": message, "num_paused_requests": 0}, status_code=400)
    message = "Succeeded to update model weights."
    if body.weight_version is not None:
        message += f" Weight version updated to {body.weight_version}."
    return {"success": True, "message": message, "num_paused_requests": 0}


@router.get("/health")
async def health(request: Request):
    state = request.app.state
    return Response(status_code=503 if state.closing or not state.engine.alive() else 200)


@router.get("/health_generate")
async def health_generate(request: Request):
    """Generates one token unless requests are already running (then they prove the engine is alive)."""
    state = request.app.state
    if state.closing:
        return Response(status_code=503)
    if state.engine.stats().get("num_running_reqs", 0) > 0:
        return Response(status_code=200)
    req = GenerateRequest(
        rid=f"HEALTH_CHECK_{time.time()}", input_ids=[0], params=SamplingParams(max_new_tokens=1, temperature=0.0)
    )

    async def one():
        async for out in state.engine.generate(req):
            if out.finished:
                return

    try:
        await asyncio.wait_for(one(), HEALTH_TIMEOUT_S)
        return Response(status_code=200)
    except Exception:
        return Response(status_code=503)


@router.get("/flush_cache")  # one route per method: each gets its own OpenAPI operation id
@router.post("/flush_cache")
async def flush_cache(request: Request):
    ok = request.app.state.engine.flush_cache()
    text = (
        "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
        "requests, the operation will not be performed.)\n"
    )
    return Response(content=text, status_code=200 if ok else 400)


@router.post("/pause_generation")
async def pause_generation(request: Request):
    """SGLang's `PauseGenerationReqInput`: {"mode": "abort" (default) | "retract" | "in_place"}."""
    state = request.app.state
    body = await read_json(request)
    mode = body.get("mode", "abort") if isinstance(body, dict) else None
    if mode not in PAUSE_MODES:
        raise ApiError(400, f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}", param="mode")
    await asyncio.to_thread(state.engine.pause, mode)
    return {"message": "Generation paused successfully.", "status": "ok"}


@router.post("/continue_generation")
async def continue_generation(request: Request):
    request.app.state.engine.resume()
    return {"message": "Generation continued successfully.", "status": "ok"}


@router.post("/abort_request")
async def abort_request(request: Request):
    """{"rid": ..., "abort_all": false}; abort_all needs the admin key. An n > 1 rid aborts all n."""
    state = request.app.state
    body = await parse(request, AbortIn)
    if body.abort_all:
        if not check_admin(request):
            raise ApiError(401, "Unauthorized: abort_all needs the admin API key", kind="authentication_error")
        state.engine.abort(None)
    else:
        for rid in state.active.get(body.rid, [body.rid]):
            state.engine.abort(rid)
    return Response(status_code=200)


@router.get("/metrics")
async def metrics(request: Request):
    state = request.app.state
    return Response(state.metrics.render(state.engine.stats()), media_type=state.metrics.content_type)
