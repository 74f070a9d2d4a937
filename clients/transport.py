"""The one transport to rollout servers (gleanrl's embedded server or stock SGLang): async httpx,
one request helper that raises `RolloutServerError` with the server's status and message, connection
errors retried with exponential backoff (a request the server received is never sent twice), SSE
streaming, and `run_blocking` for the few callers outside an event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

import httpx

_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout)
T = TypeVar("T")


class RolloutServerError(RuntimeError):
    """The server answered with an error (`status`: its HTTP status, `message`: its words), or, `status` 0,
    it could not be reached or the client refused to send."""

    def __init__(self, url: str, status: int, message: str):
        self.url, self.status, self.message = url, status, message
        super().__init__(f"{url}: {message}" if status == 0 else f"{url}: HTTP {status}: {message}")


async def sse_lines(resp: httpx.Response) -> AsyncIterator[str]:
    """SSE lines end at LF (CR LF), not at U+2028 and the other breaks httpx's aiter_lines splits on, which a
    JSON string may hold raw (stock SGLang sends them unescaped)."""
    buf = ""
    async for text in resp.aiter_text():
        *lines, buf = (buf + text).split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if buf:
        yield buf


def run_blocking(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine from synchronous code (e.g. the idle-window thread). Inside a running event loop another
    loop cannot start in this thread, so there it runs in a helper thread while this one blocks."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


@dataclass
class Transport:
    urls: list[str]  # the workers: weight updates, flushes, pauses go to each
    api_key: str | None = None
    admin_api_key: str | None = None
    timeout_s: float = 600.0  # per request (a long rollout is one request)
    connect_timeout_s: float = 5.0
    retries: int = 3  # extra attempts after a connection error
    backoff_s: float = 0.5  # first wait; doubles each attempt
    router: str | None = None  # generation only; None: spread over `urls`
    _inflight: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _http: httpx.AsyncClient | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.urls, str):
            self.urls = [self.urls]
        self.urls = [u.rstrip("/") for u in self.urls]
        if not self.urls:
            raise ValueError("a rollout-server client needs at least one server URL")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError("timeouts must be > 0, retries and backoff_s >= 0")
        if self.router is not None:
            self.router = self.router.rstrip("/")
        self._inflight = {u: 0 for u in self.urls + ([self.router] if self.router else [])}

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            timeout = httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s)
            self._http = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=None))
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def headers(self, admin: bool) -> dict[str, str]:
        key = (self.admin_api_key or self.api_key) if admin else self.api_key  # SGLang: admin falls back
        return {"Authorization": f"Bearer {key}"} if key else {}

    def pick_url(self) -> str:
        return self.router or min(self.urls, key=lambda u: self._inflight[u])

    def in_flight(self, url: str) -> int:
        """Requests to `url` not answered yet (thread-safe to read: one int)."""
        return self._inflight.get(url, 0)

    async def request(
        self, method: str, path: str, url: str | None = None, payload: dict | None = None, admin: bool = False
    ) -> Any:
        url = url or self.urls[0]
        for attempt in range(self.retries + 1):
            try:
                resp = await self.http.request(method, url + path, json=payload, headers=self.headers(admin))
                break
            except _RETRYABLE as exc:
                await self._backoff(url, attempt, exc)
        return _decode(url, resp)

    async def request_all(
        self, method: str, path: str, payload: dict | None = None, admin: bool = False, urls: list[str] | None = None
    ) -> list:
        urls = self.urls if urls is None else urls
        return list(await asyncio.gather(*(self.request(method, path, u, payload, admin) for u in urls)))

    async def stream(self, path: str, url: str, payload: dict) -> AsyncIterator[dict]:
        """POST and yield each SSE `data:` chunk until `[DONE]`; an `error` chunk raises."""
        for attempt in range(self.retries + 1):
            try:
                async with self.http.stream("POST", url + path, json=payload, headers=self.headers(False)) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        _decode(url, resp)
                    async for line in sse_lines(resp):
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            return
                        chunk = json.loads(data)
                        if "error" in chunk:
                            raise RolloutServerError(url, 500, _message(chunk))
                        yield chunk
                return
            except _RETRYABLE as exc:
                await self._backoff(url, attempt, exc)

    async def _backoff(self, url: str, attempt: int, exc: Exception) -> None:
        if attempt == self.retries:
            why = f"cannot reach the rollout server after {self.retries + 1} attempts ({type(exc).__name__})"
            raise RolloutServerError(url, 0, why) from None
        await asyncio.sleep(self.backoff_s * 2**attempt)


def _message(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)


def _decode(url: str, resp: httpx.Response) -> Any:
    """The body; an HTTP error or SGLang's `{"success": false}` whatever the status (a refused update must never
    read as done) raises with the server's own message."""
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code >= 400 or (isinstance(body, dict) and body.get("success") is False):
        raise RolloutServerError(url, resp.status_code, _message(body) or resp.reason_phrase)
    return body
