"""The FastAPI app: native SGLang routes, OpenAI routes, auth, metrics and error shapes around one
engine; the lifespan starts the engine's decode thread and shuts it down (aborting what still runs). The routes
parse their JSON bodies themselves (`edge/body.py`, for 413 and field-naming 400s), so FastAPI does not see them:
`describe_bodies` adds them to the OpenAPI document for clients and fuzzers."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gleanrl.server.config import EngineConfig, is_loopback
from gleanrl.server.engine import EngineGone
from gleanrl.server.http.config import ServerConfig
from gleanrl.server.http.edge.auth import AuthMiddleware, BrowserGuard
from gleanrl.server.http.edge.body import BodyLimit
from gleanrl.server.http.edge.errors import ApiError, validation_error
from gleanrl.server.http.generate import route
from gleanrl.server.http.metrics import Metrics
from gleanrl.server.http.native import control, discovery, harvest_feed, tokenize, weights_sync
from gleanrl.server.http.native.harvest_feed import FeedConfig, FeedState, FeedUpdatesMiddleware, HarvestFeed
from gleanrl.server.http.openai import chat, completions, models, serve

if TYPE_CHECKING:
    from gleanrl.server.engine import Engine
    from gleanrl.server.http.native.weights_sync import Session

log = logging.getLogger(__name__)
SECRET_FIELDS = ("api_key", "admin_api_key")
# the OpenAPI document lists their paths in this order
ROUTERS = (route, discovery, weights_sync, control, models, completions, chat, harvest_feed, tokenize)
REQUEST_BODIES: dict[str, type[BaseModel]] = {
    "/generate": route.GenerateIn,
    "/update_weights_from_disk": control.UpdateWeightsIn,
    "/abort_request": control.AbortIn,
    "/update_weights_from_tensor": weights_sync.TensorUpdateIn,
    "/begin_weight_update": weights_sync.BeginWeightUpdateIn,
    "/v1/completions": serve.CompletionIn,
    "/v1/chat/completions": serve.ChatIn,
    "/tokenize": tokenize.TokenizeIn,
    "/v1/tokenize": tokenize.TokenizeIn,
    "/detokenize": tokenize.DetokenizeIn,
    "/v1/detokenize": tokenize.DetokenizeIn,
    "/separate_reasoning": tokenize.SeparateReasoningIn,
}


def describe_bodies(schema: dict) -> dict:
    """`schema` with the routes' JSON request bodies."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in REQUEST_BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        for method, op in schema.get("paths", {}).get(path, {}).items():
            if method in ("post", "put"):
                ref = {"$ref": f"#/components/schemas/{model.__name__}"}
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    return schema


@dataclass(slots=True)
class AppState(FeedState):
    """What the routes read of `app.state`: set once, by `build_app`; every field typed, none added later."""

    engine: Engine
    server_cfg: ServerConfig
    tokenizer: Any  # the engine's (transformers)
    context_length: int
    vocab_size: int
    stop_token_ids: list[int] | None
    version: str  # gleanrl's
    engine_args: dict  # /server_info
    server_args: dict  # /server_info, without the keys
    served_model_name: str
    metrics: Metrics = field(default_factory=Metrics)
    active: dict[str, list[str]] = field(default_factory=dict)  # rid -> its engine rids
    weights_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closing: bool = False  # the lifespan is shutting down
    weight_session: Session | None = None  # an open weight-update session (native/weights_sync.py)
    weight_groups: dict = field(default_factory=dict)  # joined process groups (native/weights_sync.py)
    group_joining: asyncio.Lock = field(default_factory=asyncio.Lock)
    grammar_compiler: Any = None  # xgrammar's, built at first use (generate/grammar.py)


def _version() -> str:
    try:
        return version("gleanrl")
    except PackageNotFoundError:
        return "0+unknown"


def build_app(engine: Engine, server_cfg: ServerConfig, engine_cfg: EngineConfig | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            app.state.closing = True
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="gleanrl rollout server", lifespan=lifespan, docs_url=None, redoc_url=None)
    info = engine.info()
    engine_args = asdict(engine_cfg) if engine_cfg else {"model_path": info.get("model_path")}
    server_args = {k: v for k, v in asdict(server_cfg).items() if k not in SECRET_FIELDS}
    app.state = AppState(  # type: ignore[assignment]
        feed=HarvestFeed(FeedConfig(max_records=server_cfg.harvest_feed_records)) if server_cfg.harvest_feed else None,
        feed_load=lambda: {k: engine.stats().get(k) for k in ("num_running_reqs", "num_queue_reqs", "paused")},
        engine=engine,
        server_cfg=server_cfg,
        tokenizer=engine.tokenizer,
        context_length=engine.context_length,
        vocab_size=int(info.get("vocab_size") or len(engine.tokenizer)),
        stop_token_ids=sorted(engine.eos_ids) or None,
        version=_version(),
        engine_args=engine_args,
        server_args=server_args,
        served_model_name=server_cfg.served_model_name or Path(str(info.get("model_path", "model"))).name,
    )
    for module in ROUTERS:
        app.include_router(module.router)
    base_openapi = app.openapi
    app.openapi = lambda: app.openapi_schema or describe_bodies(base_openapi())  # type: ignore[method-assign]
    if app.state.feed is not None:  # inside auth: only authorised updates reach it
        app.add_middleware(FeedUpdatesMiddleware, feed=app.state.feed)
    app.add_middleware(AuthMiddleware, api_key=server_cfg.api_key, admin_api_key=server_cfg.admin_api_key)
    app.add_middleware(BrowserGuard, bound_loopback=is_loopback(server_cfg.host))
    # outermost: an oversize body is refused before any layer reads it
    app.add_middleware(
        BodyLimit, max_bytes=server_cfg.max_request_bytes, max_weight_bytes=server_cfg.max_weight_request_bytes
    )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def request_validation(request: Request, exc: RequestValidationError):
        return validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return ApiError(exc.status_code, str(exc.detail), kind=kind).response()

    @app.exception_handler(EngineGone)
    async def engine_gone(request: Request, exc: EngineGone):
        return ApiError(503, str(exc), kind="server_error").response()

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        log.exception("internal error on %s", request.url.path)
        return ApiError(500, f"internal server error: {type(exc).__name__}", kind="server_error").response()

    return app
