"""Typed async client for a rollout server speaking SGLang's native API (the embedded server or stock
SGLang). One method per endpoint over one request helper; errors carry the server's message.

Several URLs: generation goes to the URL with the fewest requests in flight, weight updates and cache
flushes go to all of them. With a `router` (sglang-router / SGLang Model Gateway, which forwards
`/generate` only), generation goes through the router and weight updates and control to every worker
URL. Only connection errors are retried (with exponential backoff): a request the server received is
never sent twice by the client.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import httpx

_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout)


async def sse_lines(resp: httpx.Response) -> AsyncIterator[str]:
    """SSE lines end at LF (CR LF): not at U+2028 and the other breaks that httpx's aiter_lines also
    splits on, which a JSON string may hold raw (stock SGLang sends them unescaped)."""
    buf = ""
    async for text in resp.aiter_text():
        *lines, buf = (buf + text).split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if buf:
        yield buf

class RolloutServerError(RuntimeError):
    """The server answered with an error (status > 0) or could not be reached (status 0)."""

    def __init__(self, url: str, status: int, message: str):
        self.url, self.status, self.message = url, status, message
        super().__init__(f"{url}: {message}" if status == 0 else f"{url}: HTTP {status}: {message}")


@dataclass
class RolloutClient:
    urls: list[str]                   # the workers: weight updates, flushes, pauses go to each
    api_key: str | None = None
    admin_api_key: str | None = None
    timeout_s: float = 600.0          # per request (a long rollout is one request)
    connect_timeout_s: float = 5.0
    retries: int = 3                  # extra attempts after a connection error
    backoff_s: float = 0.5            # first wait; doubles each attempt
    router: str | None = None         # generation only; None: spread over `urls`
    _inflight: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _http: httpx.AsyncClient | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.urls, str):
            self.urls = [self.urls]
        self.urls = [u.rstrip("/") for u in self.urls]
        if not self.urls:
            raise ValueError("RolloutClient needs at least one server URL")
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

    async def __aenter__(self) -> "RolloutClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def _headers(self, admin: bool) -> dict[str, str]:
        key = (self.admin_api_key or self.api_key) if admin else self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def pick_url(self) -> str:
        if self.router:
            return self.router
        return min(self.urls, key=lambda u: self._inflight[u])

    async def _request(self, method: str, path: str, url: str | None = None, payload: dict | None = None,
                       admin: bool = False) -> Any:
        url = url or self.urls[0]
        for attempt in range(self.retries + 1):
            try:
                resp = await self.http.request(method, url + path, json=payload, headers=self._headers(admin))
                break
            except _RETRYABLE as exc:
                if attempt == self.retries:
                    raise RolloutServerError(url, 0, f"cannot reach the rollout server after "
                                                     f"{self.retries + 1} attempts ({type(exc).__name__})") from None
                await asyncio.sleep(self.backoff_s * 2 ** attempt)
        return _decode(url, resp)

    async def _all(self, method: str, path: str, payload: dict | None = None, admin: bool = False,
                   urls: list[str] | None = None) -> list:
        urls = self.urls if urls is None else urls
        return list(await asyncio.gather(*(self._request(method, path, u, payload, admin) for u in urls)))

    # --- generation -----------------------------------------------------------------------------
    async def generate(self, input_ids: list[int], sampling_params: dict, return_logprob: bool = True,
                       rid: str | None = None, url: str | None = None) -> dict:
        url = url or self.pick_url()
        self._inflight[url] += 1
        try:
            return await self._request("POST", "/generate", url, _gen_payload(input_ids, sampling_params,
                                                                              return_logprob, rid, False))
        finally:
            self._inflight[url] -= 1

    async def generate_stream(self, input_ids: list[int], sampling_params: dict, return_logprob: bool = True,
                              rid: str | None = None, url: str | None = None) -> AsyncIterator[dict]:
        """Yield each streamed chunk (SGLang's SSE `data:` lines) until `[DONE]`."""
        url = url or self.pick_url()
        payload = _gen_payload(input_ids, sampling_params, return_logprob, rid, True)
        self._inflight[url] += 1
        try:
            for attempt in range(self.retries + 1):
                try:
                    async with self.http.stream("POST", url + "/generate", json=payload,
                                                headers=self._headers(False)) as resp:
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
                    if attempt == self.retries:
                        raise RolloutServerError(
                            url, 0, f"cannot reach the rollout server ({type(exc).__name__})") from None
                    await asyncio.sleep(self.backoff_s * 2 ** attempt)
        finally:
            self._inflight[url] -= 1

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> list:
        return await self._all("POST", "/abort_request", {"rid": rid, "abort_all": abort_all}, admin=abort_all)

    # --- weights and control (admin endpoints go to every server) --------------------------------
    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                       flush_cache: bool = True, abort_all_requests: bool = False,
                                       selector: str | None = None, urls: list[str] | None = None) -> list[dict]:
        """To every worker URL (or the given subset of them)."""
        payload: dict = {"model_path": model_path, "flush_cache": flush_cache,
                         "abort_all_requests": abort_all_requests}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        if selector is not None:  # gleanrl extension; left out for the target so stock SGLang is happy
            payload["selector"] = selector
        urls = self.urls if urls is None else urls
        results = await self._all("POST", "/update_weights_from_disk", payload, admin=True, urls=urls)
        for url, res in zip(urls, results):
            if isinstance(res, dict) and res.get("success") is False:
                raise RolloutServerError(url, 400, _message(res))
        return results

    async def flush_cache(self) -> list:
        return await self._all("POST", "/flush_cache", admin=True)

    async def pause_generation(self, mode: str = "abort") -> list:
        return await self._all("POST", "/pause_generation", {"mode": mode}, admin=True)

    async def continue_generation(self) -> list:
        return await self._all("POST", "/continue_generation", {}, admin=True)

    # --- status ----------------------------------------------------------------------------------
    async def model_info(self, url: str | None = None) -> dict:
        return await self._request("GET", "/model_info", url)

    async def server_info(self, url: str | None = None) -> dict:
        return await self._request("GET", "/server_info", url)

    async def health(self, url: str | None = None) -> bool:
        """True when the server answers /health with 200; False when it is down or not ready."""
        try:
            resp = await self.http.get((url or self.urls[0]) + "/health", timeout=self.connect_timeout_s)
        except httpx.TransportError:
            return False
        return resp.status_code == 200

    async def wait_healthy(self, timeout_s: float, poll_s: float = 0.25, alive=None) -> None:
        """Wait until every server (and the router) is healthy; raise a clear error after `timeout_s`, or
        as soon as `alive()` (e.g. "the server process still runs") turns False."""
        deadline = time.monotonic() + timeout_s
        for url in self.urls + ([self.router] if self.router else []):
            while not await self.health(url):
                if alive is not None and not alive():
                    raise RolloutServerError(url, 0, "rollout server process exited")
                if time.monotonic() > deadline:
                    raise RolloutServerError(url, 0, f"rollout server not healthy after {timeout_s:.0f}s")
                await asyncio.sleep(poll_s)


def _gen_payload(input_ids, sampling_params, return_logprob, rid, stream) -> dict:
    payload = {"input_ids": input_ids, "sampling_params": sampling_params,
               "return_logprob": return_logprob, "stream": stream}
    if rid is not None:
        payload["rid"] = rid
    return payload


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
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code >= 400:
        raise RolloutServerError(url, resp.status_code, _message(body) or resp.reason_phrase)
    return body
