"""Bearer-token auth with SGLang's semantics: `--api-key` guards every path but `/health*`; admin paths
take `--admin-api-key` when set, else `--api-key`, else nothing (SGLang's ADMIN_OPTIONAL). Pure ASGI,
so client disconnects still reach the streaming routes. Keys are compared in constant time, never echoed."""

from __future__ import annotations

import secrets

from gleanrl.server.http.edge.errors import ApiError, send_error

ADMIN_PATHS = frozenset(
    {
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/update_weights_from_distributed",
        "/begin_weight_update",
        "/end_weight_update",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/pause_generation",
        "/continue_generation",
        "/flush_cache",
        "/harvest_feed",
    }
)
OPEN_PREFIXES = ("/health",)
EITHER_KEY_PATHS = frozenset({"/abort_request"})  # the route itself asks for the admin key when abort_all


def allowed(authorization: str | None, api_key: str | None, admin_api_key: str | None, admin: bool) -> bool:
    expected = (admin_api_key or api_key) if admin else api_key
    if not expected:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected.encode())


def unauthorized() -> ApiError:
    # `Connection: close`: uvicorn closes the socket instead of draining an unread (maybe large) body
    return ApiError(
        401,
        "Unauthorized: missing or wrong API key (Authorization: Bearer <key>)",
        kind="authentication_error",
        headers={"WWW-Authenticate": "Bearer", "Connection": "close"},
    )


class AuthMiddleware:
    def __init__(self, app, api_key: str | None, admin_api_key: str | None):
        self.app, self.api_key, self.admin_api_key = app, api_key, admin_api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"].startswith(OPEN_PREFIXES):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        auth, path = headers.get("authorization"), scope["path"]
        if allowed(auth, self.api_key, self.admin_api_key, path in ADMIN_PATHS) or (
            path in EITHER_KEY_PATHS and allowed(auth, self.api_key, self.admin_api_key, True)
        ):
            return await self.app(scope, receive, send)
        await send_error(send, unauthorized())


def check_admin(request) -> bool:
    """For routes whose admin level depends on the body (abort_all)."""
    cfg = request.app.state.server_cfg
    return allowed(request.headers.get("authorization"), cfg.api_key, cfg.admin_api_key, True)
