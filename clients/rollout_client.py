"""Typed async client for a rollout server speaking SGLang's native API (embedded or stock SGLang): one method per
endpoint over the transport's request helper, bodies from `clients.payloads`, errors `RolloutServerError`.

Several URLs: generation goes to the one with the fewest requests in flight, weight updates and flushes to all.
With a `router` (sglang-router / SGLang Model Gateway, which forwards `/generate` only), generation goes through
it, weight updates and control to every worker. Routes per server kind: `clients.weight_sync`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx

from gleanrl.clients.payloads import begin_body, disk_body, generate_body
from gleanrl.clients.transport import RolloutServerError, Transport


class RolloutClient(Transport):
    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict,
        return_logprob: bool = True,
        rid: str | None = None,
        url: str | None = None,
    ) -> dict:
        url = url or self.pick_url()
        self._inflight[url] += 1
        try:
            body = generate_body(input_ids, sampling_params, return_logprob, rid, False)
            return await self.request("POST", "/generate", url, body)
        finally:
            self._inflight[url] -= 1

    async def generate_stream(
        self,
        input_ids: list[int],
        sampling_params: dict,
        return_logprob: bool = True,
        rid: str | None = None,
        url: str | None = None,
    ) -> AsyncIterator[dict]:
        """Yield each streamed chunk (SGLang's SSE `data:` lines) until `[DONE]`."""
        url = url or self.pick_url()
        self._inflight[url] += 1
        try:
            body = generate_body(input_ids, sampling_params, return_logprob, rid, True)
            async for chunk in self.stream("/generate", url, body):
                yield chunk
        finally:
            self._inflight[url] -= 1

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> list:
        return await self.request_all("POST", "/abort_request", {"rid": rid, "abort_all": abort_all}, admin=abort_all)

    # weights and control: admin, to every worker URL (or the given subset)
    async def update_weights_from_disk(
        self,
        model_path: str,
        weight_version: str | None = None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
        selector: str | None = None,
        urls: list[str] | None = None,
    ) -> list[dict]:
        body = disk_body(model_path, weight_version, flush_cache, abort_all_requests, selector)
        return await self.request_all("POST", "/update_weights_from_disk", body, admin=True, urls=urls)

    async def begin_weight_update(self, selector: str, url: str) -> dict:
        return await self.request("POST", "/begin_weight_update", url, begin_body(selector), admin=True)

    async def update_weights_from_tensor(self, body: dict, url: str) -> dict:
        """`body` from `payloads.tensor_body`; SGLang accepts it only inside a weight-update session."""
        return await self.request("POST", "/update_weights_from_tensor", url, body, admin=True)

    async def end_weight_update(self, url: str) -> dict:
        return await self.request("POST", "/end_weight_update", url, {}, admin=True)

    async def flush_cache(self) -> list:
        return await self.request_all("POST", "/flush_cache", admin=True)

    async def pause_generation(self, mode: str = "abort") -> list:
        return await self.request_all("POST", "/pause_generation", {"mode": mode}, admin=True)

    async def continue_generation(self) -> list:
        return await self.request_all("POST", "/continue_generation", {}, admin=True)

    async def model_info(self, url: str | None = None) -> dict:
        return await self.request("GET", "/model_info", url)

    async def server_info(self, url: str | None = None) -> dict:
        return await self.request("GET", "/server_info", url)

    async def health(self, url: str | None = None) -> bool:
        """True when the server answers /health with 200; False when it is down or not ready."""
        try:
            resp = await self.http.get((url or self.urls[0]) + "/health", timeout=self.connect_timeout_s)
        except httpx.TransportError:
            return False
        return resp.status_code == 200

    async def wait_healthy(
        self, timeout_s: float, poll_s: float = 0.25, alive: Callable[[], bool] | None = None
    ) -> None:
        """Wait until every server (and the router) is healthy; raise after `timeout_s`, or once `alive()` (e.g.
        "the server process still runs") turns False."""
        deadline = time.monotonic() + timeout_s
        for url in self.urls + ([self.router] if self.router else []):
            while not await self.health(url):
                if alive is not None and not alive():
                    raise RolloutServerError(url, 0, "rollout server process exited")
                if time.monotonic() > deadline:
                    raise RolloutServerError(url, 0, f"rollout server not healthy after {timeout_s:.0f}s")
                await asyncio.sleep(poll_s)
