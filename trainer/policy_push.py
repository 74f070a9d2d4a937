"""Policy pushes from the trainer to every rollout server: each checkpoint checked, each server reached
by the path that is safe for its kind.

- Check: `check_policy_checkpoint(new, serving)` against the serving model's directory (`/model_info`
  `model_path` when it is readable here, else the trainer's initial `--model`), for every server, before
  anything is sent. Stock SGLang applies what it is given: a truncated file kills the whole server,
  another architecture's weights load and answer success.
- Route: stock SGLang with an EAGLE drafter gets a `selector: "target"` tensor session (its
  `/update_weights_from_disk` also reaches the draft runner and corrupts the drafter); every other
  server (gleanrl's embedded one, SGLang without SD) gets `/update_weights_from_disk`.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from gleanrl.clients.rollout_client import RolloutClient, RolloutServerError
from gleanrl.clients.sglang_push import DRAFT_ALGORITHMS, SGLangPushError, run_session, tensor_requests
from gleanrl.harvest.checkpoint_check import CheckpointMismatch, check_policy_checkpoint

DISK, TARGET_SESSION = "update_weights_from_disk", "target_session"


def push_route(stock_sglang: bool, has_drafter: bool) -> str:
    """How a policy reaches one server."""
    return TARGET_SESSION if stock_sglang and has_drafter else DISK


def serving_reference(model_path: str | None, fallback: str | Path) -> Path:
    """The serving model's directory if readable here (same host or shared volume), else `fallback`."""
    if model_path and (Path(model_path) / "config.json").is_file():
        return Path(model_path)
    return Path(fallback)


def checkpoint_tensors(path: str | Path) -> list:
    from safetensors.torch import load_file
    files = sorted(Path(path).glob("*.safetensors"))
    return [item for f in files for item in sorted(load_file(f).items())]


class PolicyPusher:
    def __init__(self, client: RolloutClient, initial_model: str | Path, timeout_s: float = 600.0):
        self.client, self.initial_model, self.timeout_s = client, Path(initial_model), timeout_s
        self.routes: dict[str, str] = {}  # the last push's route per worker URL (for logs and tests)

    async def plan(self, path: str) -> dict[str, str]:
        """Check `path` against every server's model and choose each route; raises CheckpointMismatch."""
        routes = {}
        for url in self.client.urls:
            info = await self.client.model_info(url)
            reference = serving_reference(info.get("model_path"), self.initial_model)
            try:
                check_policy_checkpoint(path, reference)
            except CheckpointMismatch as exc:
                raise CheckpointMismatch(f"refusing to push the policy to {url}: {exc}") from None
            stock = "draft_model_path" not in info  # gleanrl's embedded server reports it, SGLang does not
            drafter = stock and (await self.client.server_info(url)).get("speculative_algorithm") in DRAFT_ALGORITHMS
            routes[url] = push_route(stock, drafter)
        return routes

    async def push(self, path: str, version: str) -> None:
        self.routes = routes = await self.plan(path)
        disk = [u for u, r in routes.items() if r == DISK]
        sessions = [u for u, r in routes.items() if r == TARGET_SESSION]
        if disk:
            await self.client.update_weights_from_disk(path, weight_version=version, urls=disk)
        if sessions:
            named = await asyncio.to_thread(checkpoint_tensors, path)
            for url in sessions:
                await asyncio.to_thread(self._session, url, named, version)

    def _session(self, url: str, named: list, version: str) -> None:
        import httpx
        key = self.client.admin_api_key or self.client.api_key
        try:
            with httpx.Client(timeout=self.timeout_s) as http:
                run_session(http, url, tensor_requests(named, "target", version, flush_cache=True), key)
        except SGLangPushError as exc:
            raise RolloutServerError(url, 400, f"policy push refused: {exc}") from None
        except httpx.HTTPError as exc:
            raise RolloutServerError(url, 0, f"policy push failed: {exc}") from None
