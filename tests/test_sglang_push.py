"""clients.sglang_push without SGLang: session ordering, refusal paths and backend detection (the real
engine's side is in tests/sglang/test_push_requests.py and test_sglang_weights.py)."""
from __future__ import annotations

import base64
import json
import pickle

import httpx
import pytest
import torch

from gleanrl.clients.sglang_push import (SGLangPushError, draft_tensor_requests, encode_named_tensors, is_stock_sglang,
                                 policy_disk_request, push_drafter_tensors, run_session)


_Client = httpx.Client


def _fake(log: list, fail: str | None = None, spec: str | None = None) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        log.append((request.url.path, json.loads(request.content or b"{}")))
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"speculative_algorithm": spec})
        if request.url.path == fail:
            return httpx.Response(400, json={"success": False, "message": "shape mismatch for fc.weight"})
        return httpx.Response(200, json={"success": True, "message": "Success"})
    return _Client(transport=httpx.MockTransport(handle), base_url="http://sglang")


def test_session_ends_even_when_the_update_fails():
    log: list = []
    named = [("fc.weight", torch.ones(2, 3))]
    with pytest.raises(SGLangPushError, match="shape mismatch for fc.weight"):
        run_session(_fake(log, fail="/update_weights_from_tensor"), "http://sglang", draft_tensor_requests(named))
    assert [p for p, _ in log] == ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]
    update = log[1][1]
    assert update["selector"] == "draft" and "weight_version" not in update and update["flush_cache"] is False


def test_tensors_travel_by_value():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)[:, 1:]      # a non-contiguous view
    decoded = pickle.loads(base64.b64decode(encode_named_tensors([("w", t)])))
    assert decoded[0][0] == "w" and torch.equal(decoded[0][1], t) and decoded[0][1].is_contiguous()


def test_draft_push_refused_when_the_server_has_no_drafter(monkeypatch):
    log: list = []
    monkeypatch.setattr(httpx, "Client", lambda **kw: _fake(log, spec=None))
    with pytest.raises(SGLangPushError, match="serves no EAGLE drafter"):
        push_drafter_tensors("http://sglang", [("fc.weight", torch.ones(1))])
    assert [p for p, _ in log] == ["/server_info"]                     # nothing was sent


def test_policy_request_has_no_selector():
    assert policy_disk_request("/ckpt/v1", "1") == {"model_path": "/ckpt/v1", "flush_cache": True,
                                                    "abort_all_requests": False, "weight_version": "1"}


def test_embedded_server_is_not_stock_sglang(tiny_qwen2):
    from serving import running_server
    with running_server(tiny_qwen2) as url, httpx.Client(timeout=30) as http:
        assert is_stock_sglang(http, url) is False
