"""The rollout-server client against real embedded servers on loopback ports."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from gleanrl.clients.rollout import Rollout, RolloutStatus
from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.transport import RolloutServerError
from serving import running_server

PROMPT = [5, 17, 33, 2, 9]


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def url(tiny_qwen2):
    with running_server(tiny_qwen2) as u:
        yield u


def test_generate_stream_and_status_endpoints(url, tiny_qwen2):
    async def go():
        async with RolloutClient([url]) as c:
            assert await c.health()
            info = await c.model_info()
            assert info["model_path"] == str(tiny_qwen2)
            assert "internal_states" in await c.server_info()
            sp = {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 7, "ignore_eos": True}
            body = await c.generate(PROMPT, sp)
            chunks = [ch async for ch in c.generate_stream(PROMPT, sp)]
            return body, chunks

    body, chunks = _run(go())
    assert len(body["output_ids"]) == 6
    lps = body["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == body["output_ids"] and all(lp <= 0 for lp, _, _ in lps)
    # seeded: same sample
    assert len(chunks) >= 2 and chunks[-1]["output_ids"] == body["output_ids"]
    r = Rollout(group_id=0, index=0, sample={"prompt": "x"}, prompt_ids=PROMPT)
    r.apply(body)
    assert r.status == RolloutStatus.TRUNCATED and r.rollout_logprobs == [lp for lp, _, _ in lps]
    assert r.weight_version == str(body["meta_info"]["weight_version"])


def test_weight_update_sets_version_and_refusal_carries_the_message(url, tiny_qwen2, tiny_qwen2_b, tmp_path):
    async def go():
        async with RolloutClient([url]) as c:
            await c.update_weights_from_disk(str(tiny_qwen2_b), weight_version="7")
            assert (await c.model_info())["weight_version"] == "7"
            with pytest.raises(RolloutServerError) as err:
                await c.update_weights_from_disk(str(tmp_path / "missing"), weight_version="8")
            assert err.value.status == 400 and "missing" in err.value.message
            assert (await c.model_info())["weight_version"] == "7"  # old weights still served
            await c.update_weights_from_disk(str(tiny_qwen2), weight_version="9")
            await c.pause_generation()
            await c.continue_generation()
            await c.flush_cache()
            await c.abort_request("no-such-rid")
            return (await c.model_info())["weight_version"]

    assert _run(go()) == "9"


def test_api_keys(tiny_qwen2):
    async def go(u):
        async with RolloutClient([u]) as anonymous:
            with pytest.raises(RolloutServerError) as err:
                await anonymous.model_info()
            assert err.value.status == 401 and "API key" in err.value.message
        async with RolloutClient([u], api_key="user") as user:
            assert (await user.generate(PROMPT, {"max_new_tokens": 2}))["output_ids"]
            with pytest.raises(RolloutServerError) as err:
                await user.update_weights_from_disk(str(tiny_qwen2), weight_version="1")
            assert err.value.status == 401
        async with RolloutClient([u], api_key="user", admin_api_key="admin") as admin:
            await admin.update_weights_from_disk(str(tiny_qwen2), weight_version="1")
            assert (await admin.model_info())["weight_version"] == "1"

    with running_server(tiny_qwen2, api_key="user", admin_api_key="admin") as u:
        _run(go(u))


def test_several_urls_spread_generation_and_update_all(tiny_qwen2, url):
    async def go(u2):
        async with RolloutClient([url, u2]) as c:
            before = [(await c.server_info(u))["internal_states"][0]["generation_tokens_total"] for u in c.urls]
            await asyncio.gather(*(c.generate(PROMPT, {"max_new_tokens": 3, "ignore_eos": True}) for _ in range(4)))
            after = [(await c.server_info(u))["internal_states"][0]["generation_tokens_total"] for u in c.urls]
            await c.update_weights_from_disk(str(tiny_qwen2), weight_version="42")
            versions = [(await c.model_info(u))["weight_version"] for u in c.urls]
            return before, after, versions

    with running_server(tiny_qwen2) as u2:
        before, after, versions = _run(go(u2))
    assert all(a > b for a, b in zip(after, before))
    assert versions == ["42", "42"]


def test_unreachable_server_is_a_clear_error_not_a_hang():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    client = RolloutClient([f"http://127.0.0.1:{port}"], retries=2, backoff_s=0.01, connect_timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(RolloutServerError) as err:
        _run(client.generate(PROMPT, {"max_new_tokens": 2}))
    assert err.value.status == 0 and "cannot reach" in str(err.value) and "3 attempts" in str(err.value)
    assert not _run(client.health())
    with pytest.raises(RolloutServerError, match="not healthy"):
        _run(client.wait_healthy(0.3))
    assert time.monotonic() - t0 < 30  # bounded (a generous bound: it must not hang)


def test_train_cli_reports_an_unreachable_server(tiny_qwen2, tmp_path, capsys, monkeypatch):
    import gleanrl.cli
    from test_train import ToyTask

    # the task is not the point here
    monkeypatch.setattr("gleanrl.trainer.loop._load_task", lambda cfg: ToyTask())
    rc = gleanrl.cli.main(
        [
            "train",
            "--model",
            str(tiny_qwen2),
            "--out",
            str(tmp_path / "o"),
            "--server",
            "http://127.0.0.1:9",
            "--server-wait-s",
            "1",
            "--steps",
            "1",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "rollout server" in err and "Traceback" not in err


def _mock_client(handler, **kw) -> RolloutClient:
    import httpx

    c = RolloutClient(["http://mock"], backoff_s=0.0, **kw)
    c._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return c


def test_retries_connection_errors_only():
    import httpx

    calls = {"n": 0}

    def refuse(request):
        calls["n"] += 1
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(RolloutServerError, match="cannot reach"):
        _run(_mock_client(refuse, retries=2).model_info())
    assert calls["n"] == 3
    calls["n"] = 0

    def fail(request):
        calls["n"] += 1
        return httpx.Response(500, json={"error": {"message": "engine exploded"}})

    with pytest.raises(RolloutServerError, match="engine exploded") as err:
        _run(_mock_client(fail, retries=2).generate(PROMPT, {}))
    assert calls["n"] == 1 and err.value.status == 500


def test_success_false_is_an_error_even_with_status_200():
    import httpx

    answer = {"success": False, "message": "Failed to update weights: shape mismatch"}
    client = _mock_client(lambda request: httpx.Response(200, json=answer))
    with pytest.raises(RolloutServerError, match="shape mismatch") as err:
        _run(client.update_weights_from_disk("/ckpt/v1", weight_version="1"))
    assert err.value.status == 200 and err.value.message == answer["message"]


def test_incremental_stream_chunks_are_concatenated():
    import json as _json

    import httpx

    from gleanrl.clients.rollout import run_rollout

    chunks = [
        {
            "output_ids": [4],
            "meta_info": {
                "completion_tokens": 1,
                "output_token_logprobs": [[-0.5, 4, None]],
                "finish_reason": None,
                "weight_version": "3",
            },
        },
        {
            "output_ids": [6],
            "meta_info": {
                "completion_tokens": 2,
                "output_token_logprobs": [[-0.25, 6, None]],
                "finish_reason": {"type": "stop", "matched": 2},
                "weight_version": "3",
            },
        },
    ]
    body = "".join(f"data: {_json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    client = _mock_client(lambda request: httpx.Response(200, text=body))
    r = Rollout(group_id=0, index=0, sample={}, prompt_ids=PROMPT, rid="x")
    _run(run_rollout(client, r, {"max_new_tokens": 4}, stream=True))
    assert r.status == RolloutStatus.FINISHED and r.output_ids == [4, 6] and r.rollout_logprobs == [-0.5, -0.25]
    assert r.weight_version == "3" and r.first_token_at is not None


def test_train_cli_config_errors_are_clear(tiny_qwen2, tmp_path, capsys):
    import gleanrl.cli

    cfg = tmp_path / "c.toml"
    cfg.write_text("steps = 3\nlearning_rate = 0.1\n")
    rc = gleanrl.cli.main(["train", "--model", str(tiny_qwen2), "--out", str(tmp_path / "o"), "--config", str(cfg)])
    assert rc == 2 and "unknown config keys: learning_rate" in capsys.readouterr().err
    rc = gleanrl.cli.main(["train", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert rc == 2 and "Hugging Face model directory" in capsys.readouterr().err
    cfg.write_text("steps = 0\n")
    rc = gleanrl.cli.main(["train", "--model", str(tiny_qwen2), "--out", str(tmp_path / "o"), "--config", str(cfg)])
    assert rc == 2 and "steps must be an integer >= 1" in capsys.readouterr().err


def test_config_file_then_flags(tiny_qwen2, tmp_path):
    from gleanrl.trainer.config import build_config, read_config_file

    (tmp_path / "c.yaml").write_text(f"model: {tiny_qwen2}\nout: {tmp_path}\nsteps: 5\nlr: 0.01\n")
    cfg = build_config(read_config_file(tmp_path / "c.yaml"), {"steps": 7, "lr": None})
    assert cfg.steps == 7 and cfg.lr == 0.01


def test_public_api_names_resolve():
    import gleanrl
    from gleanrl.clients import rollout, transport, weight_sync

    assert all(getattr(gleanrl, name) is not None for name in gleanrl.__all__)
    assert (gleanrl.Rollout, gleanrl.RolloutServerError, gleanrl.DrafterPush) == (
        rollout.Rollout,
        transport.RolloutServerError,
        weight_sync.DrafterPush,
    )
