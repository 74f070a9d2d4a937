"""The weight-sync protocol, held once: probe each server's kind, choose the route a policy or a drafter takes, refuse
what must not be sent, then send (pause-free: SD is lossless, a mid-rollout drafter swap changes speed only).

| to                             | policy                             | drafter                              |
| ------------------------------ | ---------------------------------- | ------------------------------------ |
| gleanrl's embedded server      | `/update_weights_from_disk`        | the same, with `selector: "draft"`   |
| stock SGLang with EAGLE        | tensor session, selector `target`  | tensor session, selector `draft`     |
| stock SGLang without a drafter | `/update_weights_from_disk`        | refused before sending               |

Hazards of stock SGLang (0.5.23): `/update_weights_from_disk` has no `selector` and reaches every runner, so a drafter
lands IN THE TARGET, and with SD on a policy also reaches the draft runner, whose `load_weights` overwrites part of the
drafter and fails on a shape (tests/sglang/test_eagle3_load.py): hence sessions, begin(selector) -> tensors -> end.
Without a drafter, `selector: "draft"` loads nothing and answers success: refused here. One `weight_version` for all
runners: a draft push sends none; the caller tracks the drafter's. No `flush_cache` for draft pushes: it fails while
requests run, and a swap must not wait. SGLang applies what it gets: callers check checkpoints first
(`harvest.checkpoint_check`). No NCCL pushes: the trainer syncs from the checkpoint it writes anyway.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gleanrl.clients.rollout_client import RolloutClient, tensor_body
from gleanrl.clients.transport import RolloutServerError, run_blocking

if TYPE_CHECKING:
    import torch

DRAFT_ALGORITHMS = ("EAGLE", "EAGLE3")


class Route(str, enum.Enum):
    DISK = "update_weights_from_disk"  # the policy, no selector
    TARGET_SESSION = "target_session"  # the policy, tensor session with selector "target"
    DRAFT_DISK = "draft_update_weights_from_disk"  # the drafter, `selector: "draft"` (embedded server only)
    DRAFT_SESSION = "draft_session"  # the drafter, tensor session with selector "draft"


@dataclass(frozen=True, slots=True)
class ServerKind:
    url: str
    embedded: bool  # gleanrl's server: it reports `draft_model_path` in /model_info, SGLang does not
    drafter: bool  # stock SGLang started with an EAGLE drafter (not probed for the embedded one)
    model_path: str | None  # the serving policy, as /model_info reports it


async def probe(client: RolloutClient, url: str) -> ServerKind:
    info = await client.model_info(url)
    embedded = "draft_model_path" in info
    drafter = not embedded and (await client.server_info(url)).get("speculative_algorithm") in DRAFT_ALGORITHMS
    return ServerKind(url, embedded, drafter, info.get("model_path"))


async def probe_all(client: RolloutClient) -> list[ServerKind]:
    return list(await asyncio.gather(*(probe(client, url) for url in client.urls)))


def policy_route(kind: ServerKind) -> Route:
    return Route.TARGET_SESSION if kind.drafter else Route.DISK


def drafter_route(kind: ServerKind) -> Route:
    if kind.embedded:
        return Route.DRAFT_DISK
    if not kind.drafter:
        why = "refusing the drafter push: the server serves no EAGLE drafter (started without --speculative-algorithm)"
        raise RolloutServerError(kind.url, 0, f"{why}; SGLang would answer success and load nothing")
    return Route.DRAFT_SESSION


def checkpoint_tensors(path: str | Path) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    return [item for f in files for item in sorted(load_file(f).items())]


async def push_policy(
    client: RolloutClient, path: str, version: str, kinds: list[ServerKind] | None = None
) -> dict[str, Route]:
    """The policy checkpoint at `path` to every worker as `version`; the route taken per URL."""
    routes = {k.url: policy_route(k) for k in kinds or await probe_all(client)}
    if disk := [url for url, route in routes.items() if route is Route.DISK]:
        await client.update_weights_from_disk(path, weight_version=version, urls=disk)
    if sessions := [url for url, route in routes.items() if route is Route.TARGET_SESSION]:
        body = await asyncio.to_thread(lambda: tensor_body(checkpoint_tensors(path), "target", version, True))
        for url in sessions:
            await tensor_session(client, url, "target", body)
    return routes


async def push_drafter(client: RolloutClient, path: str, version: int | str) -> dict[str, Route]:
    """The drafter checkpoint at `path` to every worker; the route per URL. All refusals come before any send."""
    routes = {k.url: drafter_route(k) for k in await probe_all(client)}
    if disk := [url for url, route in routes.items() if route is Route.DRAFT_DISK]:
        await client.update_weights_from_disk(
            path, weight_version=str(version), flush_cache=False, selector="draft", urls=disk
        )
    if sessions := [url for url, route in routes.items() if route is Route.DRAFT_SESSION]:
        body = await asyncio.to_thread(lambda: tensor_body(checkpoint_tensors(path), "draft"))
        for url in sessions:
            await tensor_session(client, url, "draft", body)
    return routes


async def tensor_session(client: RolloutClient, url: str, selector: str, body: dict) -> list[dict]:
    """begin -> update (`rollout_client.tensor_body`) -> end, the answers in order; `end_weight_update` is sent even
    when the update fails (SGLang holds the session otherwise). The server's kind is the caller's to check."""
    answers = [await client.begin_weight_update(selector, url)]
    try:
        answers.append(await client.update_weights_from_tensor(body, url))
    finally:
        answers.append(await client.end_weight_update(url))
    return answers


@dataclass(frozen=True, slots=True)
class DrafterPush:
    """`fn(path, version)` for the Harvester: pushes a drafter to `urls`, raising on failure. Blocking, in the
    idle-window thread, on a client of its own (an httpx client belongs to one event loop, and the trainer's
    loop joins that thread when the window closes: sharing could deadlock)."""

    urls: tuple[str, ...]
    api_key: str | None = None
    admin_api_key: str | None = None
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.urls, str) or not self.urls:
            raise ValueError(f"DrafterPush needs a list of server URLs, got {self.urls!r}")
        object.__setattr__(self, "urls", tuple(self.urls))

    @classmethod
    def for_client(cls, client: RolloutClient) -> DrafterPush:
        return cls(tuple(client.urls), client.api_key, client.admin_api_key, client.timeout_s)

    def __call__(self, path: str, version: int) -> None:
        async def go() -> None:
            async with RolloutClient(list(self.urls), self.api_key, self.admin_api_key, self.timeout_s) as client:
                await push_drafter(client, path, version)

        run_blocking(go)
