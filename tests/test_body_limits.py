"""Per-route body limits (issue 39): generation and OpenAI routes small (`--max-request-bytes`), the
route that carries weights by value large (`--max-weight-request-bytes`) and admin-only when a key
is set: an unkeyed body to it is refused by the key check before it is read, however large it
declares itself. Server and proxy, a real client on a loopback port; what is counted is the bytes
the client got to push, never time."""

from __future__ import annotations

import base64
import json
import pickle

import httpx
import pytest
from safetensors.torch import load_file

from gleanrl.server.http.edge.auth import ADMIN_PATHS
from gleanrl.server.http.edge.body import WEIGHT_BODY_PATHS
from proxy_util import running_proxy
from serving import greedy_ids, running_app

SMALL = 64 * 1024
WEIGHT = 4 << 20
DECLARED = 1 << 30  # 1 GiB announced; the client would need seconds to send it all
CHUNK = 64 * 1024
ADMIN = "admin-key"


class Upload:
    """A body of DECLARED bytes produced chunk by chunk; counts what the client got to send."""

    def __init__(self):
        self.sent = 0

    def __iter__(self):
        chunk = b" " * CHUNK
        while self.sent < DECLARED:
            self.sent += CHUNK
            yield chunk


def _upload(url: str, path: str, declared: bool, headers: dict | None = None) -> tuple[httpx.Response, int]:
    body = Upload()
    h = {"content-type": "application/json", **(headers or {})}
    if declared:
        h["content-length"] = str(DECLARED)
    r = httpx.post(f"{url}{path}", content=iter(body), headers=h, timeout=120)
    return r, body.sent


def _same_weights_update(model_dir) -> bytes:
    """A tensor update that sets the embedding to what it is: over SMALL, accepted, changes nothing."""
    weights = {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
    name = "model.embed_tokens.weight"
    data = pickle.dumps([(name, weights[name].contiguous().clone())], protocol=4)
    body = json.dumps({"serialized_named_tensors": [base64.b64encode(data).decode()]}).encode()
    assert SMALL < len(body) < WEIGHT, len(body)
    return body


def test_large_bodies_only_on_admin_routes():
    assert WEIGHT_BODY_PATHS <= ADMIN_PATHS


def test_weights_take_the_large_limit_generation_the_small_one(tiny_qwen2):
    update = _same_weights_update(tiny_qwen2)
    with running_app(tiny_qwen2, max_request_bytes=SMALL, max_weight_request_bytes=WEIGHT) as (url, _app):
        before = greedy_ids(url, [5, 6, 7], 8)
        headers = {"content-type": "application/json"}
        r = httpx.post(f"{url}/update_weights_from_tensor", content=update, headers=headers, timeout=120)
        assert r.status_code == 200 and r.json()["success"], r.text
        # the same bytes to a generation route: over its small limit
        for path in ("/generate", "/v1/completions"):
            r = httpx.post(f"{url}{path}", content=update, headers=headers, timeout=120)
            assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]["message"], r.text
        # over the weight limit: refused at it, named, the connection closed
        for declared in (True, False):
            r, sent = _upload(url, "/update_weights_from_tensor", declared)
            assert r.status_code == 413 and "--max-weight-request-bytes" in r.json()["error"]["message"], r.text
            assert r.headers["connection"] == "close"
            assert sent < DECLARED // 16, sent
        after = greedy_ids(url, [5, 6, 7], 8)
    assert after["output_ids"] == before["output_ids"]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_unkeyed_weight_body_is_refused_before_it_is_read(tiny_qwen2, declared):
    with running_app(tiny_qwen2, admin_api_key=ADMIN, max_weight_request_bytes=DECLARED) as (url, _app):
        before = greedy_ids(url, [5, 6, 7], 8)
        r, sent = _upload(url, "/update_weights_from_tensor", declared)
        assert r.status_code == 401 and r.headers["connection"] == "close", (r.status_code, r.headers)
        # the key check answered first: the client pushed only what the socket buffers hold
        assert sent < DECLARED // 16, sent
        after = greedy_ids(url, [5, 6, 7], 8)
    assert after["output_ids"] == before["output_ids"]


def test_the_proxy_has_the_same_two_limits(tiny_qwen2):
    update = _same_weights_update(tiny_qwen2)
    headers = {"content-type": "application/json"}
    with running_app(tiny_qwen2, max_weight_request_bytes=DECLARED) as (url, _app):
        with running_proxy(url, max_request_bytes=SMALL, max_weight_request_bytes=WEIGHT) as (px, _):
            r = httpx.post(f"{px}/update_weights_from_tensor", content=update, headers=headers, timeout=120)
            assert r.status_code == 200 and r.json()["success"], r.text
            r = httpx.post(f"{px}/generate", content=update, headers=headers, timeout=120)
            assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]["message"], r.text
            r, sent = _upload(px, "/update_weights_from_tensor", False)
            assert r.status_code == 413 and "--max-weight-request-bytes" in r.json()["error"]["message"], r.text
            assert sent < DECLARED // 16, sent
