"""Typed async client for a rollout server speaking SGLang's native API (embedded or stock SGLang): one method per
endpoint over the transport's request helper, errors `RolloutServerError`. Several URLs: generation goes to the one
with the fewest requests in flight (or through a `router`, which forwards `/generate` only), weight updates and
control to every worker. Routes per server kind: `clients.weight_sync`.

Request bodies are built here, each in one place, in the shapes of SGLang 0.5.23's `io_struct` types;
tests/sglang/test_push_requests.py parses them with SGLang's own types, so SGLang drops no field of ours.
Hazard: stock SGLang has no `selector` on `/update_weights_from_disk` (ignored: the load reaches every runner), so
`disk_body` leaves it out unless asked: only gleanrl's embedded server is sent `selector: "draft"` that way.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import pickle
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import httpx

from gleanrl.clients.transport import RolloutServerError, Transport

if TYPE_CHECKING:
    import torch

SELECTORS = ("target", "draft")


def generate_body(
    input_ids: list[int], sampling_params: dict, return_logprob: bool, rid: str | None, stream: bool
) -> dict:
    body = dict(input_ids=input_ids, sampling_params=sampling_params, return_logprob=return_logprob, stream=stream)
    return body if rid is None else body | {"rid": rid}


def disk_body(
    model_path: str,
    weight_version: str | None = None,
    flush_cache: bool = True,
    abort_all_requests: bool = False,
    selector: str | None = None,
) -> dict:
    body: dict = {"model_path": model_path, "flush_cache": flush_cache, "abort_all_requests": abort_all_requests}
    if weight_version is not None:
        body["weight_version"] = weight_version
    if selector is not None:
        body["selector"] = _checked(selector)
    return body


def tensor_body(
    named: Iterable[tuple[str, torch.Tensor]],
    selector: str,
    weight_version: str | None = None,
    flush_cache: bool = False,
    tp_size: int = 1,
) -> dict:
    """Tensors by value, one identical payload per TP rank. A draft update never carries a `weight_version`:
    SGLang keeps one for all runners, and the policy's must stay."""
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if selector == "draft" and weight_version is not None:
        raise ValueError("a draft update must not carry a weight_version (SGLang would overwrite the policy's)")
    body = {
        "serialized_named_tensors": [encode_named_tensors(named)] * tp_size,
        "selector": _checked(selector),
        "flush_cache": flush_cache,
        "abort_all_requests": False,
    }
    return body if weight_version is None else body | {"weight_version": weight_version}


def encode_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Base64 of a plain pickle of [(name, cpu tensor)]: by value (SGLang's SafeUnpickler rebuilds them with
    `torch.load(weights_only=True)`), so the trainer may be on another host."""
    payload = [(name, t.detach().to("cpu").contiguous().clone()) for name, t in named]
    return base64.b64encode(pickle.dumps(payload, protocol=4)).decode("ascii")


def _checked(selector: str) -> str:
    if selector not in SELECTORS:
        raise ValueError(f"selector must be 'target' or 'draft', got {selector!r}")
    return selector


class RolloutClient(Transport):
    @contextlib.contextmanager
    def _counted(self, url: str | None) -> Iterator[str]:
        """`url` (else the client's pick), counted in flight while open."""
        url = url or self.pick_url()
        self._inflight[url] += 1
        try:
            yield url
        finally:
            self._inflight[url] -= 1

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict,
        return_logprob: bool = True,
        rid: str | None = None,
        url: str | None = None,
    ) -> dict:
        with self._counted(url) as url:
            body = generate_body(input_ids, sampling_params, return_logprob, rid, False)
            return await self.request("POST", "/generate", url, body)

    async def generate_stream(
        self,
        input_ids: list[int],
        sampling_params: dict,
        return_logprob: bool = True,
        rid: str | None = None,
        url: str | None = None,
    ) -> AsyncIterator[dict]:
        """Yield each streamed chunk (SGLang's SSE `data:` lines) until `[DONE]`."""
        with self._counted(url) as url:
            body = generate_body(input_ids, sampling_params, return_logprob, rid, True)
            async for chunk in self.stream("/generate", url, body):
                yield chunk

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
        return await self.request("POST", "/begin_weight_update", url, {"selector": _checked(selector)}, admin=True)

    async def update_weights_from_tensor(self, body: dict, url: str) -> dict:
        """`body` from `tensor_body`; SGLang accepts it only inside a weight-update session."""
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
