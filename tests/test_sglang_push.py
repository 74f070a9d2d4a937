"""clients.weight_sync without SGLang: server-kind probe, routes, session ordering, refusals before
sending, tensors by value (the real engine's side is in tests/sglang/test_push_requests.py and
test_sglang_weights.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import pickle

import httpx
import pytest
import torch
from safetensors.torch import save_file

from gleanrl.clients.rollout_client import RolloutClient, disk_body, encode_named_tensors, tensor_body
from gleanrl.clients.transport import RolloutServerError, run_blocking
from gleanrl.clients.weight_sync import Route, ServerKind, drafter_route, policy_route, probe, push_drafter, push_policy


def fake_client(
    log: list,
    spec: str | None = None,
    embedded: bool = False,
    fail: str | None = None,
    urls: tuple[str, ...] = ("http://sglang",),
) -> RolloutClient:
    """A client whose every request goes to a fake server (stock SGLang unless `embedded`)."""

    def handle(request: httpx.Request) -> httpx.Response:
        log.append((request.url.host, request.url.path, json.loads(request.content or b"{}")))
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"model_path": "/p", **({"draft_model_path": None} if embedded else {})})
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"speculative_algorithm": spec})
        if request.url.path == fail:  # SGLang answers a refused update with success false (and 400)
            return httpx.Response(400, json={"success": False, "message": "shape mismatch for fc.weight"})
        return httpx.Response(200, json={"success": True, "message": "Success"})

    client = RolloutClient(list(urls), admin_api_key="adm", backoff_s=0.0)
    client._http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return client


@pytest.fixture
def ckpt(tmp_path):
    save_file({"fc.weight": torch.ones(2, 3), "norm.weight": torch.arange(3.0)}, tmp_path / "model.safetensors")
    return str(tmp_path)


def _posts(log: list) -> list[tuple[str, dict]]:
    return [(path, body) for _, path, body in log if path not in ("/model_info", "/server_info")]


def test_probe_tells_the_kinds_apart():
    log: list = []
    assert asyncio.run(probe(fake_client(log, embedded=True), "http://sglang")).embedded
    # the embedded server needs no second look
    assert [p for _, p, _ in log] == ["/model_info"]
    kind = asyncio.run(probe(fake_client([], spec="EAGLE3"), "http://sglang"))
    assert not kind.embedded and kind.drafter and kind.model_path == "/p"
    assert not asyncio.run(probe(fake_client([], spec=None), "http://sglang")).drafter


def test_routes_by_server_kind():
    embedded, sd, plain = (
        ServerKind("u", True, False, None),
        ServerKind("u", False, True, None),
        ServerKind("u", False, False, None),
    )
    assert [policy_route(k) for k in (embedded, sd, plain)] == [Route.DISK, Route.TARGET_SESSION, Route.DISK]
    assert [drafter_route(k) for k in (embedded, sd)] == [Route.DRAFT_DISK, Route.DRAFT_SESSION]
    with pytest.raises(RolloutServerError, match="serves no EAGLE drafter") as err:
        drafter_route(plain)
    assert err.value.status == 0


def test_drafter_session_ends_even_when_the_update_fails(ckpt):
    log: list = []
    with pytest.raises(RolloutServerError, match="shape mismatch for fc.weight") as err:
        asyncio.run(push_drafter(fake_client(log, spec="EAGLE3", fail="/update_weights_from_tensor"), ckpt, 3))
    assert err.value.status == 400
    posts = _posts(log)
    assert [p for p, _ in posts] == ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]
    begin, update = posts[0][1], posts[1][1]
    assert begin == {"selector": "draft"} and update["selector"] == "draft" and update["flush_cache"] is False
    # SGLang keeps one version: the policy's
    assert "weight_version" not in update
    sent = pickle.loads(base64.b64decode(update["serialized_named_tensors"][0]))
    assert [n for n, _ in sent] == ["fc.weight", "norm.weight"] and torch.equal(sent[1][1], torch.arange(3.0))


def test_drafter_to_servers_without_one_is_refused_before_anything_is_sent(ckpt):
    log: list = []
    client = fake_client(log, spec=None, urls=("http://a", "http://b"))
    with pytest.raises(RolloutServerError, match="serves no EAGLE drafter"):
        asyncio.run(push_drafter(client, ckpt, 1))
    assert _posts(log) == []  # not even to the first server


def test_embedded_server_gets_a_draft_disk_load(ckpt):
    log: list = []
    routes = asyncio.run(push_drafter(fake_client(log, embedded=True), ckpt, 4))
    assert routes == {"http://sglang": Route.DRAFT_DISK}
    assert _posts(log) == [("/update_weights_from_disk", disk_body(ckpt, "4", False, selector="draft"))]


def test_policy_routes_send_the_builders_bodies(ckpt):
    log: list = []
    assert asyncio.run(push_policy(fake_client(log, spec=None), ckpt, "7")) == {"http://sglang": Route.DISK}
    assert _posts(log) == [("/update_weights_from_disk", disk_body(ckpt, "7"))]
    # stock SGLang would ignore it anyway
    assert "selector" not in _posts(log)[0][1]
    log.clear()
    asyncio.run(push_policy(fake_client(log, spec="EAGLE3"), ckpt, "8"))
    (_, begin), (_, update), _ = _posts(log)
    assert begin == {"selector": "target"} and update["weight_version"] == "8" and update["flush_cache"] is True


def test_tensors_travel_by_value_and_draft_bodies_carry_no_version():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)[:, 1:]  # a non-contiguous view
    decoded = pickle.loads(base64.b64decode(encode_named_tensors([("w", t)])))
    assert decoded[0][0] == "w" and torch.equal(decoded[0][1], t) and decoded[0][1].is_contiguous()
    with pytest.raises(ValueError, match="weight_version"):
        tensor_body([("w", t)], "draft", weight_version="3")
    with pytest.raises(ValueError, match="selector"):
        disk_body("/p", selector="drafter")


def test_run_blocking_works_inside_a_running_loop():
    async def answer() -> int:
        return 42

    async def caller() -> int:
        # a sync callback inside async code (e.g. the harvester's re-push)
        return run_blocking(answer)

    assert run_blocking(answer) == 42 and asyncio.run(caller()) == 42


def test_embedded_server_is_probed_as_embedded(tiny_qwen2):
    from serving import running_server

    async def go(url):
        async with RolloutClient([url]) as client:
            return await probe(client, url)

    with running_server(tiny_qwen2) as url:
        kind = asyncio.run(go(url))
    assert kind.embedded and kind.model_path == str(tiny_qwen2)
