"""Request bodies over the limit (`--max-request-bytes`, one name in the server and the proxy) are
refused before they are read: a declared `Content-Length` over it gets 413 at once, without calling
the app; a chunked body raises the same 413 from `receive` as soon as the bytes received pass it,
so the rest is never buffered. A pure ASGI middleware, outermost, so no other layer reads first.

Every 413 says `Connection: close`: uvicorn then closes the socket instead of reading and discarding
the rest of the body (hundreds of megabytes parsed on the event loop would stall every other
client), and the client sees the answer as soon as its next write fails."""

from __future__ import annotations

import json

from gleanrl.server.http.schemas import ApiError, too_large


def declared_length(scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            return await _answer(send, too_large(self.max_bytes, declared))
        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large(self.max_bytes)
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
            await _answer(send, exc)


async def _answer(send, exc: ApiError) -> None:
    body = json.dumps(exc.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
