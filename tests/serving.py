"""Test helper: a real gleanrl server (embedded engine + HTTP app) on a free loopback port, run by
uvicorn in a background thread of the test process.

    with running_server(model_dir, api_key="k", max_running_requests=4) as url:
        httpx.post(f"{url}/generate", ...)

Keyword arguments go to `ServerConfig` when it has the field, else to `EngineConfig`. The yielded
URL also carries `.app` (the FastAPI app, whose `state.engine` is the engine) via `running_app`. The engine runs in
the test process (`engine_process=False`, so tests may look inside it) unless `engine_process=True` is given."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

from gleanrl.server.config import EngineConfig
from gleanrl.server.http.app import build_app
from gleanrl.server.http.config import ServerConfig

_SERVER_FIELDS = {f.name for f in dataclasses.fields(ServerConfig)}


@contextmanager
def running_app(model_dir, *, engine=None, startup_timeout: float = 120.0, **kw):
    """Yields (url, app)."""
    from gleanrl.server.engine import Engine, EngineProcess

    server_kw = {"engine_process": False, **{k: v for k, v in kw.items() if k in _SERVER_FIELDS}}
    engine_kw = {k: v for k, v in kw.items() if k not in _SERVER_FIELDS}
    engine_cfg = EngineConfig(model_path=str(model_dir), **{"num_threads": 1, **engine_kw})
    engine = engine or (EngineProcess if server_kw["engine_process"] else Engine)(engine_cfg)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server_cfg = ServerConfig(host="127.0.0.1", port=port, **server_kw)
    app = build_app(engine, server_cfg, engine_cfg)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"test server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield url, app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def running_server(model_dir, **kw):
    """Yields the base URL of a running server (see the module docstring)."""
    with running_app(model_dir, **kw) as (url, _app):
        yield url


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def server_stats(url: str, headers: dict | None = None) -> dict:
    return httpx.get(f"{url}/server_info", headers=headers, timeout=10).json()["internal_states"][0]


def post(url: str, path: str, body: dict, timeout: float = 300.0) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=timeout)


def greedy_ids(url: str, input_ids: list[int], n: int = 10) -> dict:
    """A greedy /generate of n tokens (EOS ignored); fails the test on a non-200."""
    r = post(
        url,
        "/generate",
        {"input_ids": input_ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}},
    )
    assert r.status_code == 200, r.text
    return r.json()
