"""Auth and resource limits on a real server. Every admin route is 401 without the admin key (no
key, a wrong key, the user key); every route but /health* is 401 without the API key; keys never
appear in logs, responses or /server_info; the server binds to 127.0.0.1 unless told. Bodies and
prompts are bounded (413/400) and n / max_new_tokens are capped by configuration, on the native and
OpenAI routes. Extends test_http_errors (which covers the native /generate field errors)."""

from __future__ import annotations

import logging

import httpx
import pytest

from gleanrl.server.http.edge.auth import ADMIN_PATHS
from serving import running_app

USER, ADMIN = "sk-user-7f3a9c", "sk-admin-1b2e4d"
H_USER, H_ADMIN = {"Authorization": f"Bearer {USER}"}, {"Authorization": f"Bearer {ADMIN}"}
LIMITS = dict(max_request_bytes=2048, max_n=3, max_new_tokens_cap=16, context_length=64, max_batch=64)


@pytest.fixture(scope="module")
def server(tiny_qwen2):
    with running_app(tiny_qwen2, api_key=USER, admin_api_key=ADMIN, **LIMITS) as (url, app):
        yield url, app


def _routes(app) -> list[tuple[str, str]]:
    out = []
    for path, ops in app.openapi()["paths"].items():
        for method in ops:
            out.append((method.upper(), path.replace("{model}", "m")))
    return out


def test_every_admin_route_needs_the_admin_key(server, caplog):
    url, app = server
    caplog.set_level(logging.DEBUG)
    routes = _routes(app)
    admin = [(m, p) for m, p in routes if p in ADMIN_PATHS]
    assert {p for _, p in admin} == set(ADMIN_PATHS)
    for method, path in admin:
        for headers in (
            {},
            {"Authorization": "Bearer nope"},
            {"Authorization": f"Bearer {USER}x"},
            H_USER,
            {"Authorization": ADMIN},
        ):
            r = httpx.request(method, f"{url}{path}", headers=headers, json={"model_path": "/nonexistent"}, timeout=30)
            assert r.status_code == 401, (method, path, headers, r.status_code)
            assert r.json()["error"]["type"] == "authentication_error"
        r = httpx.request(method, f"{url}{path}", headers=H_ADMIN, json={"model_path": "/nonexistent"}, timeout=30)
        assert r.status_code != 401, (method, path)
    httpx.post(f"{url}/continue_generation", headers=H_ADMIN, timeout=30)
    for headers in ({}, H_USER):
        r = httpx.post(f"{url}/abort_request", json={"abort_all": True}, headers=headers, timeout=30)
        assert r.status_code == 401
    assert httpx.post(f"{url}/abort_request", json={"abort_all": True}, headers=H_ADMIN, timeout=30).status_code == 200
    _no_keys(caplog.text)


def test_the_api_key_guards_everything_but_health(server, caplog):
    url, app = server
    caplog.set_level(logging.DEBUG)
    routes = _routes(app)
    assert len(routes) >= 15
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {USER}"}):
            r = httpx.request(method, f"{url}{path}", headers=headers, json={}, timeout=30)
            want_open = path.startswith("/health")
            assert (r.status_code != 401) == want_open, (method, path, r.status_code)
            _no_keys(r.text)
    for path in ("/server_info", "/model_info", "/metrics", "/v1/models"):
        r = httpx.get(f"{url}{path}", headers=H_USER, timeout=30)
        assert r.status_code == 200, path
        _no_keys(r.text)
    # unknown paths too: no probing
    assert httpx.get(f"{url}/nonexistent-route", timeout=30).status_code == 401
    _no_keys(caplog.text)


def _no_keys(text: str) -> None:
    assert USER not in text and ADMIN not in text and "sk-user" not in text and "sk-admin" not in text


def test_binds_to_loopback_by_default():
    import argparse

    from gleanrl.server import cli
    from gleanrl.server.http.config import ServerConfig

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model", "m"])
    assert args.host == "127.0.0.1" and ServerConfig().host == "127.0.0.1"
    args = parser.parse_args(["--model", "m", "--max-n", "2", "--max-new-tokens-cap", "5", "--max-request-bytes", "99"])
    assert (args.max_n, args.max_new_tokens_cap, args.max_request_bytes) == (2, 5, 99)


def _chunked(n: int):
    yield b'{"text": "'
    for _ in range(n):
        yield b"x" * 512
    yield b'"}'


@pytest.mark.parametrize(
    "path", ["/generate", "/v1/completions", "/v1/chat/completions", "/update_weights_from_disk", "/abort_request"]
)
def test_bodies_are_bounded_with_and_without_content_length(server, path):
    url, _ = server
    headers = H_ADMIN if path == "/update_weights_from_disk" else H_USER
    big = {
        "text": "x" * 4000,
        "prompt": "x" * 4000,
        "model": "m",
        "model_path": "x" * 4000,
        "rid": "x" * 4000,
        "messages": [{"role": "user", "content": "x" * 4000}],
    }
    assert httpx.post(f"{url}{path}", headers=headers, json=big, timeout=30).status_code == 413
    r = httpx.post(
        f"{url}{path}", headers={**headers, "content-type": "application/json"}, content=_chunked(20), timeout=30
    )
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_prompt_n_and_max_tokens_are_capped_on_every_route(server):
    url, _ = server
    model = httpx.get(f"{url}/v1/models", headers=H_USER, timeout=30).json()["data"][0]["id"]
    long_ids = list(range(3, 3 + 64))
    cases = [
        ("/generate", {"input_ids": long_ids}, "input_ids"),
        ("/generate", {"text": "hi", "sampling_params": {"n": 4}}, "n"),
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 17}}, "max_new_tokens"),
        ("/generate", {"input_ids": [[1]] * 300}, "input_ids"),  # many prompts x n in one body
        ("/v1/completions", {"model": model, "prompt": long_ids}, "prompt"),
        ("/v1/completions", {"model": model, "prompt": "hi", "n": 4}, "n"),
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 17}, "max_tokens"),
        ("/v1/completions", {"model": model, "prompt": [[1]] * 300}, "prompt"),
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi " * 70}]}, "messages"),
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}], "n": 4}, "n"),
        (
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 17},
            "max_tokens",
        ),
    ]
    for path, body, field in cases:
        r = httpx.post(f"{url}{path}", headers=H_USER, json=body, timeout=60)
        assert r.status_code == 400, (path, field, r.status_code, r.text[:200])
        assert field in r.json()["error"]["message"], (path, field, r.json())
    ok = httpx.post(
        f"{url}/generate",
        headers=H_USER,
        json={"text": "hi", "sampling_params": {"n": 3, "max_new_tokens": 16, "temperature": 0, "ignore_eos": True}},
        timeout=60,
    )
    assert ok.status_code == 200 and [len(o["output_ids"]) for o in ok.json()] == [16] * 3


def test_default_max_new_tokens_fits_a_low_cap(server):
    url, _ = server
    r = httpx.post(
        f"{url}/generate", headers=H_USER, json={"text": "hi", "sampling_params": {"ignore_eos": True}}, timeout=60
    )
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == LIMITS["max_new_tokens_cap"]


def test_keys_stay_out_of_argv_and_written_configs(tiny_qwen2, tmp_path, monkeypatch):
    import argparse

    from gleanrl.server import cli
    from gleanrl.trainer.config import TrainConfig
    from gleanrl.trainer.server_proc import EmbeddedServer

    cfg = TrainConfig(model=str(tiny_qwen2), out=str(tmp_path), api_key=USER, admin_api_key=ADMIN)
    _no_keys(str(cfg.to_dict()))  # config.resolved.json and every checkpoint's train_config.json
    assert cfg.to_dict()["api_key"] == "<redacted>"
    assert TrainConfig(model=str(tiny_qwen2), out="o").to_dict()["api_key"] is None
    # argv is public (ps)
    srv = EmbeddedServer("m", api_key=USER, admin_api_key=ADMIN)
    _no_keys(" ".join(srv.command()) + srv.config_path.read_text())  # nor in its settings file
    monkeypatch.setenv("GLEANRL_API_KEY", USER)
    monkeypatch.setenv("GLEANRL_ADMIN_API_KEY", ADMIN)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model", "m"])
    assert (args.api_key, args.admin_api_key) == (USER, ADMIN)
