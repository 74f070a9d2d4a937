"""Who may call, as pure ASGI guards (client disconnects still reach the streaming routes). `BrowserGuard`
(403) stops a web page in the user's browser from driving a keyless server on 127.0.0.1: against DNS
rebinding a loopback-bound server's Host must name a loopback address or the bound one; a cross-site
`Origin` must be a loopback origin or the server's own. `AuthMiddleware` checks bearer keys with SGLang's
semantics: `--api-key` guards every path but `/health*`; admin paths take `--admin-api-key` when set, else
`--api-key`, else nothing (SGLang's ADMIN_OPTIONAL). Keys are compared in constant time, never echoed."""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit

from gleanrl.server.config import is_loopback
from gleanrl.server.http.edge.errors import ApiError, send_error

ADMIN_PATHS = frozenset(
    """/update_weights_from_disk /update_weights_from_tensor /update_weights_from_distributed /begin_weight_update
    /end_weight_update /init_weights_update_group /destroy_weights_update_group /release_memory_occupation
    /resume_memory_occupation /pause_generation /continue_generation /flush_cache /harvest_feed""".split()
)
OPEN_PREFIXES = ("/health",)
EITHER_KEY_PATHS = frozenset({"/abort_request"})  # the route itself asks for the admin key when abort_all


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


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
        auth, path = _headers(scope).get("authorization"), scope["path"]
        if allowed(auth, self.api_key, self.admin_api_key, path in ADMIN_PATHS) or (
            path in EITHER_KEY_PATHS and allowed(auth, self.api_key, self.admin_api_key, True)
        ):
            return await self.app(scope, receive, send)
        await send_error(send, unauthorized())


def check_admin(request) -> bool:
    """For routes whose admin level depends on the body (abort_all)."""
    cfg = request.app.state.server_cfg
    return allowed(request.headers.get("authorization"), cfg.api_key, cfg.admin_api_key, True)


def _hostname(authority: str) -> str:
    """'127.0.0.1:30000' -> '127.0.0.1', '[::1]:30000' -> '::1', 'example.com' -> 'example.com'."""
    try:
        return (urlsplit(f"//{authority}").hostname or "").lower()
    except ValueError:
        return ""


def refusal(headers: dict[str, str], scope_server: tuple | None, bound_loopback: bool) -> str | None:
    """Why the request is refused, or None."""
    host = headers.get("host")
    own = str(scope_server[0]).lower() if scope_server else ""
    if bound_loopback and host is not None and not (is_loopback(_hostname(host)) or _hostname(host) == own):
        return f"Host {host!r} is not this server's address (a loopback server answers loopback names only)"
    origin = headers.get("origin")
    if origin is not None:
        name = _hostname(origin.split("://", 1)[-1]) if "://" in origin else ""
        if not (is_loopback(name) or (host is not None and name == _hostname(host))):
            return f"cross-origin request from {origin!r} refused"
    return None


class BrowserGuard:
    """Before auth and any body read."""

    def __init__(self, app, bound_loopback: bool):
        self.app, self.bound_loopback = app, bound_loopback

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        why = refusal(_headers(scope), scope.get("server"), self.bound_loopback)
        if why is None:
            return await self.app(scope, receive, send)
        await send_error(send, ApiError(403, why, kind="permission_error"))
