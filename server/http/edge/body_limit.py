"""Request bodies over their route's limit are refused (413) before they are read. Two limits, one name each in the
server and the proxy: `--max-weight-request-bytes` (large) for the route that carries weights by value (admin-only when
a key is set: `AuthMiddleware`, inside this one, refuses an unkeyed request before reading a byte),
`--max-request-bytes` (small) for every other route: the fewer bytes a refused body may push, the less the event loop
that feeds the engine spends on it. A declared `Content-Length` over the limit is refused at once; a chunked body as
soon as the bytes passed it. Pure ASGI, outermost. Every 413 says `Connection: close`, so uvicorn closes the socket
instead of reading and discarding the rest (hundreds of megabytes on the event loop would stall every client)."""

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


class BodyLimit:
    def __init__(self, app, max_bytes: int, max_weight_bytes: int):
        self.app, self.max_bytes, self.max_weight_bytes = app, max_bytes, max_weight_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, setting = route_limit(scope["path"], self.max_bytes, self.max_weight_bytes)
        declared = next((v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"), b"")
        declared = int(declared) if declared.isdigit() else None
        if declared is not None and declared > limit:
            return await send_error(send, too_large(limit, declared, setting))
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
