"""Bearer-token auth with SGLang's semantics. `--api-key` guards every path but `/health*`; admin
paths (weight updates, pause/continue, flush, abort-all, the harvest feed) take `--admin-api-key`
when it is set, else `--api-key`, else nothing (SGLang's ADMIN_OPTIONAL level). A pure ASGI
middleware, so client disconnects still reach the streaming routes. Keys are compared in constant
time and never echoed."""

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
# the route itself asks for the admin key when abort_all
EITHER_KEY_PATHS = frozenset({"/abort_request"})


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def allowed(authorization: str | None, api_key: str | None, admin_api_key: str | None, admin: bool) -> bool:
    expected = (admin_api_key or api_key) if admin else api_key
    if not expected:
        return True
    token = _bearer(authorization)
    return token is not None and secrets.compare_digest(token.encode(), expected.encode())


def unauthorized() -> ApiError:
    # the body is never read: uvicorn closes the socket instead of draining it (a weight route's
    # limit is large, body_limit.py)
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
    state = request.app.state
    return allowed(request.headers.get("authorization"), state.server_cfg.api_key, state.server_cfg.admin_api_key, True)
