"""Reading a request body: within its route's limit (413; `body_limit.route_limit`), JSON by content
type (415), parsed (400) and validated into the route's pydantic model (a 400 naming the field). A
large body is parsed in a worker thread. Models check types (fields a model does not name are
ignored, pydantic's default, unless it says otherwise); value ranges are checked by
`server.protocol.SamplingParams`."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gleanrl.server.http.edge.body_limit import route_limit
from gleanrl.server.http.edge.errors import ApiError, too_large, validation_error

M = TypeVar("M", bound=BaseModel)
OFF_LOOP_BYTES = 64 * 1024  # bodies larger than this are parsed in a worker thread


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


async def read_body(request, max_bytes: int, setting: str = "--max-request-bytes") -> bytes:
    """The request body; 413 over `max_bytes` (declared or streamed; `BodyLimit` refuses first)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes, int(declared), setting)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes, setting=setting)
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_routed(request) -> bytes:
    """The body within the limit the server's flags set for this route (the one `BodyLimit` holds)."""
    cfg = request.app.state.server_cfg
    return await read_body(
        request, *route_limit(request.scope["path"], cfg.max_request_bytes, cfg.max_weight_request_bytes)
    )


async def off_loop(fn, size: int, *args):
    """`fn(*args)`, in a worker thread when its input is over OFF_LOOP_BYTES: parsing a large
    body on the event loop would stall every stream it serves."""
    return await asyncio.to_thread(fn, *args) if size > OFF_LOOP_BYTES else fn(*args)


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON body: {str(exc)[:200]}", param="body") from None


async def read_json(request) -> Any:
    """The request body as JSON; 413 over the route's limit, 415 unless JSON by content type, 400
    when it is not JSON."""
    return await _json(request, await _read_routed(request))


async def _json(request, raw: bytes) -> Any:
    if not raw.strip():
        return {}
    kind = request.headers.get("content-type")
    if kind is not None and not _is_json(kind):  # a browser form's types are refused (CSRF)
        raise ApiError(415, f"Content-Type must be application/json, got {kind[:100]!r}", param="content-type")
    return await off_loop(_loads, len(raw), raw)


def _validate(model: type[M], data: dict) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def parse(request, model: type[M]) -> M:
    """The body as `model` (read as `read_json` reads it; a JSON object)."""
    raw = await _read_routed(request)
    data = await _json(request, raw)
    if not isinstance(data, dict):
        raise ApiError(400, "the JSON body must be an object", param="body")
    return await off_loop(_validate, len(raw), model, data)
