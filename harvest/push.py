"""Pushing a drafter checkpoint to the rollout server(s): `POST /update_weights_from_disk` with
`selector: "draft"` (gleanrl's extension; the KV cache is kept, a draft swap does not change it).

`make_pusher(push)` turns what a caller has into `fn(path, version)` that raises on failure:
None (no server: keep checkpoints only), a URL or list of URLs (a plain blocking HTTP call), a client
with `update_weights_from_disk(model_path, weight_version, flush_cache, selector)` (sync or async), or
any callable `fn(path, version)`. An async client is driven on the event loop it belongs to: set
`pusher.loop` (the Harvester's trainer hooks do) and push from another thread, e.g. the idle window.
"""
from __future__ import annotations

import asyncio
import inspect
from typing import Any


class PushError(RuntimeError):
    """The server refused the drafter or could not be reached; it keeps serving the old one."""


class Pusher:
    def __init__(self, target: Any = None, admin_api_key: str | None = None, timeout_s: float = 120.0):
        self.target, self.admin_api_key, self.timeout_s = target, admin_api_key, timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, path: str, version: int) -> None:
        t = self.target
        if t is None:
            return
        if isinstance(t, (str, list, tuple)):
            return self._http([t] if isinstance(t, str) else list(t), path, version)
        if hasattr(t, "update_weights_from_disk"):
            result = t.update_weights_from_disk(model_path=path, weight_version=str(version), flush_cache=False,
                                                selector="draft")
        else:
            result = t(path, version)
        if inspect.isawaitable(result):
            self._wait(result)

    def _http(self, urls: list[str], path: str, version: int) -> None:
        import httpx
        headers = {"Authorization": f"Bearer {self.admin_api_key}"} if self.admin_api_key else {}
        body = {"model_path": path, "weight_version": str(version), "flush_cache": False, "selector": "draft"}
        for url in urls:
            try:
                resp = httpx.post(f"{url.rstrip('/')}/update_weights_from_disk", json=body, headers=headers,
                                  timeout=self.timeout_s)
            except httpx.HTTPError as exc:
                raise PushError(f"{url}: cannot push drafter {path}: {exc}") from None
            try:
                reply = resp.json()
            except ValueError:
                reply = {"message": resp.text}
            if resp.status_code != 200 or (isinstance(reply, dict) and reply.get("success") is False):
                message = reply.get("message", reply) if isinstance(reply, dict) else reply
                raise PushError(f"{url}: drafter {path} refused (HTTP {resp.status_code}): {message}")

    def _wait(self, coro) -> None:
        loop = self.loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if loop is not None and loop.is_running():
            if loop is current:
                coro.close()
                raise PushError("an async client cannot be pushed to from its own event loop thread; "
                                "push from the idle window's thread or use a URL")
            asyncio.run_coroutine_threadsafe(coro, loop).result(self.timeout_s)
        else:
            asyncio.run(coro)


def make_pusher(push: Any, admin_api_key: str | None = None) -> Pusher:
    return push if isinstance(push, Pusher) else Pusher(push, admin_api_key)
