"""Pushing a drafter checkpoint to the rollout server(s). gleanrl's embedded server: `POST
/update_weights_from_disk` with `selector: "draft"` (its extension; the KV cache is kept). Stock SGLang
ignores that `selector` and would load the drafter INTO THE TARGET, so a server that is stock SGLang
(`clients.sglang_push.is_stock_sglang`) gets a `selector: "draft"` weight-update session instead
(`push_drafter_dir`, which refuses a server started without a drafter); a drafter is never sent through
a path SGLang would apply to the target.

`make_pusher(push)` turns what a caller has into `fn(path, version)` that raises on failure:
None (no server: keep checkpoints only), a URL or list of URLs, a client with `urls` (and
`admin_api_key`) such as `clients.rollout_client.RolloutClient`, any object with a blocking
`update_weights_from_disk(model_path, weight_version, flush_cache, selector)`, or any callable
`fn(path, version)`. URLs and clients are pushed to with a plain blocking HTTP call, never through the
caller's event loop: pushes run in the idle-window thread, which that loop joins when the window
closes, so waiting on the loop from there could deadlock.
"""
from __future__ import annotations

import inspect
from typing import Any


class PushError(RuntimeError):
    """The server refused the drafter or could not be reached; it keeps serving the old one."""


class Pusher:
    def __init__(self, target: Any = None, admin_api_key: str | None = None, timeout_s: float = 120.0):
        self.target, self.admin_api_key, self.timeout_s = target, admin_api_key, timeout_s

    def __call__(self, path: str, version: int) -> None:
        t = self.target
        if t is None:
            return
        if isinstance(t, (str, list, tuple)):
            return self._http([t] if isinstance(t, str) else list(t), path, version)
        if isinstance(getattr(t, "urls", None), list):
            key = getattr(t, "admin_api_key", None) or getattr(t, "api_key", None)  # SGLang: admin falls back
            return self._http(t.urls, path, version, key, getattr(t, "api_key", None))
        if hasattr(t, "update_weights_from_disk"):
            result = t.update_weights_from_disk(model_path=path, weight_version=str(version), flush_cache=False,
                                                selector="draft")
        else:
            result = t(path, version)
        if inspect.isawaitable(result):
            result.close()
            raise PushError("an async push callable cannot be awaited from the idle window; pass URLs or the client")

    def _http(self, urls: list[str], path: str, version: int, admin_api_key: str | None = None,
              api_key: str | None = None) -> None:
        import httpx

        from gleanrl.clients.sglang_push import SGLangPushError, is_stock_sglang, push_drafter_dir
        key = admin_api_key or self.admin_api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model_path": path, "weight_version": str(version), "flush_cache": False, "selector": "draft"}
        for url in urls:
            try:
                with httpx.Client(timeout=self.timeout_s) as http:
                    stock = is_stock_sglang(http, url, api_key or key)
                if stock:  # never /update_weights_from_disk: SGLang would apply it to the target
                    push_drafter_dir(url, path, admin_api_key=key, api_key=api_key, timeout_s=self.timeout_s)
                    continue
            except SGLangPushError as exc:
                raise PushError(f"drafter {path} refused: {exc}") from None
            except httpx.HTTPError as exc:
                raise PushError(f"{url}: cannot push drafter {path}: {exc}") from None
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


def make_pusher(push: Any, admin_api_key: str | None = None) -> Pusher:
    return push if isinstance(push, Pusher) else Pusher(push, admin_api_key)
