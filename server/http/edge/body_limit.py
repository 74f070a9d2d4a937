"""Request bodies over their route's limit are refused before they are read. Two limits, one name each
in the server and the proxy: `--max-weight-request-bytes` (large) for the route whose body carries
weights by value (`/update_weights_from_tensor`, admin-only when a key is set: `AuthMiddleware`, inside
this one, refuses an unkeyed request before reading a byte of it), `--max-request-bytes` (small) for
every other route, generation and OpenAI included: the fewer bytes a refused body may push, the less
the event loop that also feeds the engine spends on it (docs/reliability.md). The check: a declared
`Content-Length` over the limit gets 413 at once, without calling the app; a chunked body raises the
same 413 from `receive` as soon as the bytes received pass it, so the rest is never buffered. A pure
ASGI middleware, outermost, so no other layer reads first.

Every 413 says `Connection: close`: uvicorn then closes the socket instead of reading and discarding
the rest of the body (hundreds of megabytes parsed on the event loop would stall every other
client), and the client sees the answer as soon as its next write fails."""

from __future__ import annotations

from gleanrl.server.http.edge.errors import ApiError, send_error, too_large

# Invariant: a subset of auth.ADMIN_PATHS (tests/test_body_limits.py), so a large body is read only
# from a client holding the admin key, where one is set.
WEIGHT_BODY_PATHS = frozenset({"/update_weights_from_tensor"})
WEIGHT_SETTING = "--max-weight-request-bytes"
# the defaults of both, server and proxy: one full 128k-token prompt as input_ids fits the small one
MAX_REQUEST_BYTES = 2 * 1024 * 1024
MAX_WEIGHT_REQUEST_BYTES = 1024 * 1024 * 1024
SETTING = "--max-request-bytes"


def route_limit(path: str, max_bytes: int, max_weight_bytes: int) -> tuple[int, str]:
    """(bytes, the flag that sets them) for a request to `path`."""
    return (max_weight_bytes, WEIGHT_SETTING) if path in WEIGHT_BODY_PATHS else (max_bytes, SETTING)


def declared_length(scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BodyLimit:
    def __init__(self, app, max_bytes: int, max_weight_bytes: int):
        self.app, self.max_bytes, self.max_weight_bytes = app, max_bytes, max_weight_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, setting = route_limit(scope["path"], self.max_bytes, self.max_weight_bytes)
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            return await send_error(send, too_large(limit, declared, setting))
        received = 0
        started = False

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
