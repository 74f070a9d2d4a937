"""Policy pushes from the trainer: every checkpoint checked against the serving model before
anything is sent, and the route chosen by server kind (a `selector: "target"` session for stock
SGLang with a drafter, `/update_weights_from_disk` otherwise)."""

from __future__ import annotations

import asyncio
import base64
import pickle
import shutil

import httpx
import pytest

import gleanrl.cli
from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.weight_sync import Route
from gleanrl.harvest.checkpoint_check import CheckpointMismatch
from gleanrl.trainer.run import PolicyPusher, serving_reference
from serving import running_server
from test_integration_push import fake_sglang


def _push(url: str, initial, path, version: str = "7") -> PolicyPusher:
    async def go():
        async with RolloutClient([url], admin_api_key="adm") as client:
            pusher = PolicyPusher(client, initial)
            await pusher.push(str(path), version)
            return pusher

    return asyncio.run(go())


def test_serving_reference_falls_back_to_the_initial_model(tiny_qwen2, tmp_path):
    assert serving_reference(str(tiny_qwen2), tmp_path) == tiny_qwen2
    # a hub id, not readable here
    assert serving_reference("Qwen/Qwen3-8B", tiny_qwen2) == tiny_qwen2
    assert serving_reference(None, tiny_qwen2) == tiny_qwen2


def test_sd_sglang_gets_a_target_session(tiny_qwen2, tiny_qwen2_b):
    with fake_sglang(spec="EAGLE3", model_path=str(tiny_qwen2)) as (url, log):
        pusher = _push(url, tiny_qwen2, tiny_qwen2_b)
    posts = [(path, body) for method, path, body in log if method == "POST"]
    assert pusher.routes == {url: Route.TARGET_SESSION}
    assert [p for p, _ in posts] == ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]
    update = posts[1][1]
    assert posts[0][1]["selector"] == "target" and update["selector"] == "target" and update["weight_version"] == "7"
    names = {n for n, _ in pickle.loads(base64.b64decode(update["serialized_named_tensors"][0]))}
    assert "model.embed_tokens.weight" in names


def test_plain_sglang_gets_a_disk_load_without_selector(tiny_qwen2, tiny_qwen2_b):
    with fake_sglang(spec=None, model_path=str(tiny_qwen2)) as (url, log):
        pusher = _push(url, tiny_qwen2, tiny_qwen2_b)
    posts = [(path, body) for method, path, body in log if method == "POST"]
    assert pusher.routes == {url: Route.DISK}
    assert [p for p, _ in posts] == ["/update_weights_from_disk"]
    assert posts[0][1]["model_path"] == str(tiny_qwen2_b) and "selector" not in posts[0][1]


def test_bad_checkpoints_are_refused_before_anything_is_sent(tiny_qwen2, tiny_llama, tmp_path):
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_qwen2, truncated)
    f = next(truncated.glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[:-100])
    for bad, why in [(truncated, "truncated"), (tiny_llama, "architectures")]:
        with fake_sglang(spec="EAGLE3", model_path=str(tiny_qwen2)) as (url, log):
            with pytest.raises(CheckpointMismatch, match=why):
                _push(url, tiny_qwen2, bad)
        assert not [p for m, p, _ in log if m == "POST"]
    with fake_sglang(spec=None, model_path="/not/here") as (url, log):
        # unreadable: the initial model decides
        with pytest.raises(CheckpointMismatch, match="architectures"):
            _push(url, tiny_qwen2, tiny_llama)
    assert not [p for m, p, _ in log if m == "POST"]


def test_train_refuses_a_server_that_serves_another_model(tiny_qwen2, tiny_llama, tmp_path, capsys):
    with running_server(tiny_llama) as url:
        before = httpx.get(f"{url}/model_info", timeout=30).json()
        rc = gleanrl.cli.main(
            ["train", "--model", str(tiny_qwen2), "--out", str(tmp_path / "run"), "--server", url, "--steps", "1"]
        )
        after = httpx.get(f"{url}/model_info", timeout=30).json()
    assert rc == 2
    err = capsys.readouterr().err
    assert "refusing to push the policy" in err and "architectures" in err and "Traceback" not in err
    assert after["weight_version"] == before["weight_version"] and after["model_path"] == str(tiny_llama)
