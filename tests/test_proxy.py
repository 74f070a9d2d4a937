"""`gleanrl proxy` in front of a gleanrl server: every request and response forwarded unchanged
(plain, streaming, errors, keys passed through), and the harvest feed filled from what it relays
(the same records the server's own feed holds). Against stock SGLang:
tests/sglang/test_sglang_proxy.py."""

from __future__ import annotations

import json

import httpx

from gleanrl.server.http.native.harvest_feed import HarvestFeed
from gleanrl.server.proxy.app import _note_control
from gleanrl.server.proxy.parse import per_output
from tests.proxy_util import running_proxy
from tests.serving import running_server

PADM = {"Authorization": "Bearer padm"}

ADMIN = {"Authorization": "Bearer adm"}
USER = {"Authorization": "Bearer user"}


def _strip(obj):
    """Drop what differs between two runs of the same greedy request (ids, timings)."""
    if isinstance(obj, list):
        return [_strip(o) for o in obj]
    meta = {k: v for k, v in obj["meta_info"].items() if k not in ("id", "e2e_latency")}
    return obj | {"meta_info": meta}


def _same(a, b) -> bool:
    """Equal, floats to 1e-5: two runs of one greedy request may batch its n samples differently
    (a logprob then differs in the last bits), while the proxy relays the bytes it got."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-5
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_forwards_unchanged_and_keys_pass_through(tiny_qwen2):
    body = {
        "input_ids": [[3, 4, 5], [6, 7]],
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.0, "n": 2},
    }
    with (
        running_server(tiny_qwen2, api_key="user", admin_api_key="adm", harvest_feed=True) as up,
        running_proxy(up, admin_api_key="padm") as (px, _app),
    ):
        direct = httpx.post(f"{up}/generate", json=body, headers=USER, timeout=60)
        relayed = httpx.post(f"{px}/generate", json=body, headers=USER, timeout=60)
        assert relayed.status_code == direct.status_code == 200
        assert _same(_strip(relayed.json()), _strip(direct.json())), (relayed.json(), direct.json())
        assert relayed.headers["content-type"] == direct.headers["content-type"]
        assert [k for k, _ in relayed.headers.multi_items()] == [k for k, _ in direct.headers.multi_items()]
        nokey = httpx.post(f"{px}/generate", json=body, timeout=60)
        assert nokey.status_code == 401 and nokey.content == httpx.post(f"{up}/generate", json=body).content
        bad = httpx.post(f"{px}/generate", json={"input_ids": []}, headers=USER, timeout=60)
        assert bad.status_code == 400 and "empty" in bad.json()["error"]["message"]
        assert (
            httpx.get(f"{px}/model_info", headers=USER, timeout=30).json()
            == httpx.get(f"{up}/model_info", headers=USER, timeout=30).json()
        )
        stream = {"input_ids": [3, 4], "stream": True, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
        with httpx.stream("POST", f"{px}/generate", json=stream, headers=USER, timeout=60) as r:
            lines = [x for x in r.iter_lines() if x]
        assert r.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"
        assert len(json.loads(lines[-2][5:])["output_ids"]) == 6
        # the proxy's feed (its own admin key) holds what the server's feed holds
        assert httpx.get(f"{px}/harvest_feed", headers=ADMIN, timeout=30).status_code == 401
        mine = httpx.get(f"{px}/harvest_feed", headers={"Authorization": "Bearer padm"}, timeout=30).json()
        theirs = httpx.get(f"{up}/harvest_feed", headers=ADMIN, timeout=30).json()
    keys = ("prompt_ids", "output_ids", "weight_version", "finish_reason", "group_key")
    relayed_ids = {r["rid"] for r in mine["records"]}
    assert len(mine["records"]) == 5 and mine["load"]["num_running_reqs"] == 0
    assert [[r[k] for k in keys] for r in mine["records"]] == [
        [r[k] for k in keys] for r in theirs["records"] if r["rid"] in relayed_ids
    ]
    assert [r["prompt_ids"] for r in mine["records"][:4]] == [[3, 4, 5], [3, 4, 5], [6, 7], [6, 7]]


def test_control_calls_set_load_and_weight_updates(tiny_qwen2, tiny_qwen2_b):
    with running_server(tiny_qwen2) as up, running_proxy(up, admin_api_key="padm") as (px, _app):
        assert httpx.post(f"{px}/pause_generation", json={}, timeout=30).status_code == 200
        assert httpx.get(f"{px}/harvest_feed", headers=PADM, timeout=30).json()["load"]["paused"] is True
        httpx.post(f"{px}/continue_generation", json={}, timeout=30).raise_for_status()
        up_ok = httpx.post(
            f"{px}/update_weights_from_disk", json={"model_path": str(tiny_qwen2_b), "weight_version": "7"}, timeout=120
        )
        assert up_ok.status_code == 200 and up_ok.json()["success"]
        refused = httpx.post(f"{px}/update_weights_from_disk", json={"model_path": "/nonexistent"}, timeout=30)
        assert refused.status_code == 400  # refused upstream: not listed as an update
        page = httpx.get(f"{px}/harvest_feed", headers=PADM, timeout=30).json()
    assert page["load"]["paused"] is False
    assert page["weight_updates"] == [
        {"kind": "disk", "weight_version": "7", "model_path": str(tiny_qwen2_b), "after_seq": 0}
    ]


def test_unreachable_upstream_is_a_502_naming_it():
    with running_proxy("http://127.0.0.1:9", admin_api_key="padm") as (px, _app):
        resp = httpx.post(f"{px}/generate", json={"input_ids": [1]}, timeout=30)
        assert resp.status_code == 502 and "127.0.0.1:9" in resp.json()["error"]["message"]
        assert httpx.get(f"{px}/harvest_feed", headers=PADM, timeout=30).json()["load"]["num_running_reqs"] == 0


def test_prompts_expand_like_sglang_batches():
    assert per_output({"input_ids": [1, 2], "sampling_params": {"n": 3}}) == [([1, 2], None)] * 3
    assert per_output({"text": ["a", "b"], "sampling_params": [{"n": 1}, {"n": 2}]}) == [
        (None, "a"),
        (None, "b"),
        (None, "b"),
    ]
    assert per_output({"rid": "x"}) is None


def test_only_policy_updates_are_listed():
    feed, load, ok = HarvestFeed(), {}, b'{"success": true}'
    # a drafter push
    _note_control("/update_weights_from_tensor", b'{"selector": "draft"}', ok, load, feed)
    _note_control("/update_weights_from_distributed", b'{"weight_version": "3"}', b'{"success": false}', load, feed)
    assert feed.read(0)["weight_updates"] == []
    _note_control("/update_weights_from_tensor", b'{"selector": "target", "weight_version": "4"}', ok, load, feed)
    assert [(u["kind"], u["weight_version"]) for u in feed.read(0)["weight_updates"]] == [("tensor", "4")]


def test_cli_refuses_a_bad_upstream():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "gleanrl", "proxy", "--upstream", "127.0.0.1:30000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--upstream must be an http(s) URL" in done.stderr
