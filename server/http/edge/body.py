"""Request bodies within their route's limit: `BodyLimit` refuses one over it (413) before it is read;
`parse` reads JSON (415 for another content type, 400 malformed, parsed off the event loop when large) and
validates it into the route's pydantic model (a 400 naming the field). Value ranges are checked by
`server.protocol.SamplingParams`."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gleanrl.server.http.edge.errors import ApiError, send_error, too_large, validation_error

M = TypeVar("M", bound=BaseModel)
OFF_LOOP_BYTES = 64 * 1024  # bodies larger than this are parsed in a worker thread
# Invariant: a subset of auth.ADMIN_PATHS (tests/test_body_limits.py), so a large body is read only
# from a client holding the admin key, where one is set.
WEIGHT_BODY_PATHS = frozenset({"/update_weights_from_tensor"})
WEIGHT_SETTING, SETTING = "--max-weight-request-bytes", "--max-request-bytes"
# the defaults of both, server and proxy: one full 128k-token prompt as input_ids fits the small one
MAX_REQUEST_BYTES = 2 * 1024 * 1024
MAX_WEIGHT_REQUEST_BYTES = 1024 * 1024 * 1024


def route_limit(path: str, max_bytes: int, max_weight_bytes: int) -> tuple[int, str]:
    """(bytes, the flag that sets them) for a request to `path`."""
    return (max_weight_bytes, WEIGHT_SETTING) if path in WEIGHT_BODY_PATHS else (max_bytes, SETTING)


class BodyLimit:
    """Pure ASGI, outermost: a declared `Content-Length` over the route's limit is refused at once, a chunked
    body as soon as the bytes pass it. The small limit keeps what a refused body may push off the event loop
    that feeds the engine; every 413 says `Connection: close`, so uvicorn closes the socket instead of reading
    and discarding the rest (hundreds of megabytes on the event loop would stall every client)."""

    def __init__(self, app, max_bytes: int, max_weight_bytes: int):
        self.app, self.max_bytes, self.max_weight_bytes = app, max_bytes, max_weight_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, setting = route_limit(scope["path"], self.max_bytes, self.max_weight_bytes)
        declared = next((v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"), b"")
        if declared.isdigit() and int(declared) > limit:
            return await send_error(send, too_large(limit, int(declared), setting))
        received, started = 0, False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise too_large(limit, setting=setting)
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except ApiError as exc:  # the 413 from receive, where no layer inside answered it
            if exc.status != 413 or started:
                raise
            await send_error(send, exc)


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


async def read_body(request, max_bytes: int, setting: str = SETTING) -> bytes:
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
