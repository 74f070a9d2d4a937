"""Requests a web page in the user's browser could make are refused (403), so a page cannot drive a
keyless server on 127.0.0.1: against DNS rebinding, a loopback-bound server's Host header must name a
loopback address or the bound one; a cross-site `Origin` (browsers send one on every cross-origin
POST) must be a loopback origin or the server's own. Pure ASGI, before auth and any body read."""

from __future__ import annotations

from urllib.parse import urlsplit

from gleanrl.server.config import is_loopback
from gleanrl.server.http.edge.errors import ApiError, send_error


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
    def __init__(self, app, bound_loopback: bool):
        self.app, self.bound_loopback = app, bound_loopback

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        why = refusal(headers, scope.get("server"), self.bound_loopback)
        if why is None:
            return await self.app(scope, receive, send)
        await send_error(send, ApiError(403, why, kind="permission_error"))
