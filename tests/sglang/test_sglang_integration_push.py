"""The trainer's and harvester's push paths against real SGLang 0.5.23 on CPU (no SD there): a
drafter push is refused before anything is sent (SGLang would load nothing and answer success), the
policy goes by `/update_weights_from_disk` after its check, and a checkpoint that does not fit is
refused with the server left serving."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.transport import RolloutServerError
from gleanrl.clients.weight_sync import DrafterPush, Route
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.checkpoint_check import CheckpointMismatch
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.trainer.run import PolicyPusher

pytestmark = pytest.mark.sglang


def _info(server) -> dict:
    return httpx.get(f"{server.url}/model_info", timeout=30).json()


def _push_policy(url: str, initial, path, version: str) -> dict:
    async def go():
        async with RolloutClient([url]) as client:
            pusher = PolicyPusher(client, initial)
            await pusher.push(str(path), version)
            return pusher.routes

    return asyncio.run(go())


def test_drafter_push_is_refused_without_a_drafter(sglang_server, sglang_model, tmp_path):
    drafter = save_drafter(init_drafter(sglang_model, seed=0), tmp_path / "drafter")
    before = _info(sglang_server)
    with pytest.raises(RolloutServerError, match="serves no EAGLE drafter"):
        DrafterPush([sglang_server.url])(str(drafter), 1)
    assert sglang_server.alive() and _info(sglang_server)["weight_version"] == before["weight_version"]


def test_policy_push_checked_then_by_disk(restore_weights, sglang_model, sglang_model_b, other_arch_model):
    server = restore_weights
    with pytest.raises(CheckpointMismatch, match="refusing to push the policy"):
        _push_policy(server.url, sglang_model, other_arch_model, "bad")
    assert server.alive() and _info(server)["weight_version"] != "bad"
    assert _push_policy(server.url, sglang_model, sglang_model_b, "int7") == {server.url: Route.DISK}
    assert _info(server)["weight_version"] == "int7"
