"""Test helper: `gleanrl proxy` (server.proxy) on a free loopback port, in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from gleanrl.server.proxy.app import build_proxy


@contextmanager
def running_proxy(upstream: str, admin_api_key: str | None = None, **kw):
    """Yields (url, app) of a proxy in front of `upstream`."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    app = build_proxy(upstream, admin_api_key, **kw)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", server_header=False, date_header=False)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test proxy did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
