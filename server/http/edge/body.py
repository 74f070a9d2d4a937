"""Reading a request body: within its route's limit (413), JSON by content type (415), parsed (400) and
validated into the route's pydantic model (a 400 naming the field); a large body off the event loop.
Models check types; value ranges are checked by `server.protocol.SamplingParams`."""

from __future__ import annotations

import asyncio
import functools
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


async def off_loop(fn, size: int, *args):
    """`fn(*args)`, in a worker thread when its input is large (on the event loop it stalls every stream)."""
    return await asyncio.to_thread(fn, *args) if size > OFF_LOOP_BYTES else fn(*args)


async def _read(request) -> tuple[bytes, Any]:
    """The body within the limit the server's flags set for its route, and its JSON."""
    cfg = request.app.state.server_cfg
    raw = await read_body(
        request, *route_limit(request.scope["path"], cfg.max_request_bytes, cfg.max_weight_request_bytes)
    )
    if not raw.strip():
        return raw, {}
    kind = request.headers.get("content-type")
    if kind is not None and not _is_json(kind):  # a browser form's types are refused (CSRF)
        raise ApiError(415, f"Content-Type must be application/json, got {kind[:100]!r}", param="content-type")
    try:
        return raw, await off_loop(functools.partial(json.loads, parse_constant=_no_constants), len(raw), raw)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON body: {str(exc)[:200]}", param="body") from None


async def read_json(request) -> Any:
    """The request body as JSON (413, 415, 400 as `parse`)."""
    return (await _read(request))[1]


async def parse(request, model: type[M]) -> M:
    """The body as `model` (a JSON object)."""
    raw, data = await _read(request)
    if not isinstance(data, dict):
        raise ApiError(400, "the JSON body must be an object", param="body")
    try:
        return await off_loop(model.model_validate, len(raw), data)
    except ValidationError as exc:
        raise validation_error(exc) from None
