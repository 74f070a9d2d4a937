"""`gleanrl proxy --upstream URL --port P`: relays every request and response to any SGLang-API server unchanged
(bytes, status, headers, SSE as it comes; API keys pass through) and serves the harvest feed (`GET /harvest_feed`,
only with its own `--admin-api-key`) from what it sees: each finished `/generate` (a text prompt as `prompt_text`; the
OpenAI routes pass unrecorded), the load (`/generate`s in flight, paused between `/pause_generation` and
`/continue_generation`), relayed policy weight updates. Bounds as the server's: 413 over the body limits before
reading, large bodies parsed off the event loop, a /generate over `max_outputs` (prompts x n) 400, browser pages 403."""

from __future__ import annotations

import os
import sys
import weakref
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.datastructures import Headers

from gleanrl.base.heap import freeze_heap
from gleanrl.server.config import is_loopback
from gleanrl.server.http.edge.auth import BrowserGuard, allowed, unauthorized
from gleanrl.server.http.edge.body import (
    MAX_REQUEST_BYTES,
    MAX_WEIGHT_REQUEST_BYTES,
    BodyLimit,
    off_loop,
    read_body,
    route_limit,
)
from gleanrl.server.http.edge.errors import ApiError, send_error
from gleanrl.server.http.native.harvest_feed import FeedConfig, FeedState, HarvestFeed
from gleanrl.server.http.native.harvest_feed import router as feed_router
from gleanrl.server.proxy.parse import MAX_OUTPUTS, Recorder, TooMany

HOP_HEADERS = frozenset(
    "host content-length connection keep-alive transfer-encoding te upgrade proxy-connection trailer".split()
)


def build_proxy(
    upstream: str,
    admin_api_key: str | None = None,
    feed_cfg: FeedConfig | None = None,
    timeout_s: float = 3600.0,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    max_weight_request_bytes: int = MAX_WEIGHT_REQUEST_BYTES,
    max_outputs: int = MAX_OUTPUTS,
    host: str = "127.0.0.1",
) -> FastAPI:
    upstream = upstream.rstrip("/")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await http.aclose()

    app = FastAPI(title="gleanrl proxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    load = {"num_running_reqs": 0, "num_queue_reqs": None, "paused": False}
    feed = HarvestFeed(feed_cfg) if admin_api_key else None  # it holds every prompt and completion: keyed only
    app.state = FeedState(feed, lambda: dict(load))  # type: ignore[assignment]
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=30.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )

    app.add_middleware(FeedGuard, feed_on=feed is not None, admin_api_key=admin_api_key)
    app.include_router(feed_router)
    app.add_middleware(BrowserGuard, bound_loopback=is_loopback(host))
    # outermost: an oversize body is refused before any layer reads it
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, max_weight_bytes=max_weight_request_bytes)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
    async def forward(request: Request, path: str):
        route = "/" + path
        try:
            body = await read_body(request, *route_limit(route, max_request_bytes, max_weight_request_bytes))
            recorder = await off_loop(Recorder.for_request, len(body), route, request.method, body, feed, max_outputs)
        except ApiError as exc:
            return exc.response()
        except TooMany as exc:
            return ApiError(400, str(exc), param="sampling_params.n").response()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
        url = httpx.URL(upstream + route, query=request.url.query.encode())
        # from now: a non-streamed reply has no headers before it ends
        load["num_running_reqs"] += recorder is not None
        try:
            resp = await http.send(http.build_request(request.method, url, headers=headers, content=body), stream=True)
        except httpx.HTTPError as exc:
            load["num_running_reqs"] -= recorder is not None
            return ApiError(
                502, f"gleanrl proxy: upstream {upstream} unreachable: {exc}", kind="server_error"
            ).response()
        out_headers = [  # repeated ones (set-cookie) kept
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in resp.headers.multi_items()
            if k.lower() not in HOP_HEADERS - {"content-length"}
        ]
        if recorder is None:
            data = await resp.aread()
            await resp.aclose()
            if resp.status_code == 200 and feed is not None:
                _note_control(route, body, data, load, feed)
            return _with_headers(Response(data, status_code=resp.status_code), out_headers)

        released = []

        def release() -> None:
            # once: at the body's end, or when a body never iterated is collected
            if not released:
                released.append(True)
                load["num_running_reqs"] -= 1

        async def relay():
            try:
                async for chunk in resp.aiter_raw():
                    recorder.feed_bytes(chunk)
                    yield chunk
                if resp.status_code == 200:
                    recorder.finish()
            finally:
                release()
                await resp.aclose()

        body_iter = relay()
        # a client gone before the first chunk never starts the body
        weakref.finalize(body_iter, release)
        return _with_headers(StreamingResponse(body_iter, status_code=resp.status_code), out_headers)

    return app


class FeedGuard:
    """`/harvest_feed`: 404 when the feed is off, 401 without the admin key. Pure ASGI (a
    BaseHTTPMiddleware would hand the route a body-limit error as an exception group)."""

    def __init__(self, app, feed_on: bool, admin_api_key: str | None):
        self.app, self.feed_on, self.admin_api_key = app, feed_on, admin_api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/harvest_feed":
            return await self.app(scope, receive, send)
        if not self.feed_on:
            message = (
                "the proxy's harvest feed is off: it needs --admin-api-key (the feed holds every prompt and completion)"
            )
            return await ApiError(404, message, kind="not_found_error").response()(scope, receive, send)
        if not allowed(Headers(scope=scope).get("authorization"), None, self.admin_api_key, True):
            no = unauthorized()  # without `Connection: close`: a GET has no body to drain
            return await send_error(
                send, ApiError(401, no.message, kind=no.kind, headers={"WWW-Authenticate": "Bearer"})
            )
        await self.app(scope, receive, send)


def _with_headers(response: Response, headers: list[tuple[bytes, bytes]]) -> Response:
    response.raw_headers = headers  # exactly the upstream's (Starlette would add its own content-type)
    return response


def _note_control(route: str, body: bytes, reply: bytes, load: dict, feed: HarvestFeed) -> None:
    """Pause state and relayed policy weight updates, from successful control calls."""
    if route == "/pause_generation":
        load["paused"] = True
    elif route == "/continue_generation":
        load["paused"] = False
    else:
        feed.note_relayed_update(route, body, reply)


def add_arguments(p) -> None:
    p.add_argument("--upstream", required=True, help="the rollout server to forward to, e.g. http://127.0.0.1:30000")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=30001, help="port to listen on")
    p.add_argument(
        "--admin-api-key",
        default=os.environ.get("GLEANRL_ADMIN_API_KEY"),
        help="Bearer key for the proxy's /harvest_feed (or env GLEANRL_ADMIN_API_KEY); every other path passes its "
        "keys through to the upstream, which checks them",
    )
    for name, default, help in (
        (
            "--harvest-feed-records",
            4096,
            "finished requests the feed holds; the oldest are dropped (and counted) beyond it",
        ),
        (
            "--max-request-bytes",
            MAX_REQUEST_BYTES,
            "request bodies over this on every route but /update_weights_from_tensor: 413",
        ),
        (
            "--max-weight-request-bytes",
            MAX_WEIGHT_REQUEST_BYTES,
            "request bodies over this on /update_weights_from_tensor (relayed; the upstream checks its key): 413",
        ),
        ("--max-batch", MAX_OUTPUTS, "most outputs (prompts x n) one /generate may ask for; more: 400"),
    ):
        p.add_argument(name, type=int, default=default, help=help)
    p.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error"], help="log verbosity"
    )


def run(args) -> int:
    if not args.upstream.startswith(("http://", "https://")):
        print(f"gleanrl proxy: error: --upstream must be an http(s) URL, got {args.upstream!r}", file=sys.stderr)
        return 2
    try:
        app = build_proxy(
            args.upstream,
            args.admin_api_key,
            FeedConfig(max_records=args.harvest_feed_records),
            max_request_bytes=args.max_request_bytes,
            max_weight_request_bytes=args.max_weight_request_bytes,
            max_outputs=args.max_batch,
            host=args.host,
        )
    except ValueError as exc:
        print(f"gleanrl proxy: error: {exc}", file=sys.stderr)
        return 2
    freeze_heap()  # as the server: a full collection would stall every relayed stream
    feed = "harvest feed at /harvest_feed" if args.admin_api_key else "no harvest feed: it needs --admin-api-key"
    print(f"gleanrl proxy: http://{args.host}:{args.port} -> {args.upstream} ({feed})", file=sys.stderr)
    try:  # no server or date header: the upstream's are relayed
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=10,
            server_header=False,
            date_header=False,
        )
    except OSError as exc:
        print(f"gleanrl proxy: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0
