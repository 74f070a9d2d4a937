"""Drafter pushes by server kind: stock SGLang gets a `selector: "draft"` weight-update session
(never `/update_weights_from_disk`, which it would apply to the target), and a stock server without
a drafter is refused before anything is sent; the embedded server keeps its
`/update_weights_from_disk` draft swap."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gleanrl.clients.transport import RolloutServerError
from gleanrl.clients.weight_sync import DrafterPush
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from serving import running_server


@contextmanager
def fake_sglang(spec: str | None, model_path: str = "/nonexistent/policy"):
    """Answers like stock SGLang 0.5.23 (no `draft_model_path` in /model_info); records
    every request."""
    log: list[tuple[str, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            log.append(("GET", self.path, {}))
            if self.path == "/model_info":
                return self._answer({"model_path": model_path, "weight_version": "default"})
            return self._answer({"speculative_algorithm": spec, "weight_version": "default"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            log.append(("POST", self.path, body))
            self._answer({"success": True, "message": "Success"})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def drafter_dir(tiny_qwen2, tmp_path_factory):
    return save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path_factory.mktemp("push") / "drafter")


def test_stock_sglang_gets_a_draft_session_never_a_disk_load(drafter_dir):
    with fake_sglang(spec="EAGLE3") as (url, log):
        DrafterPush([url], admin_api_key="adm")(str(drafter_dir), 3)
    posts = [(path, body) for method, path, body in log if method == "POST"]
    assert [p for p, _ in posts] == ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]
    assert all(body.get("selector") in ("draft", None) for _, body in posts) and posts[0][1]["selector"] == "draft"
    assert "weight_version" not in posts[1][1]  # SGLang keeps one version: the policy's must stay
    assert not any(p == "/update_weights_from_disk" for _, p, _ in log)


def test_stock_sglang_without_drafter_is_refused_before_any_push(drafter_dir):
    with fake_sglang(spec=None) as (url, log):
        with pytest.raises(RolloutServerError, match="serves no EAGLE drafter"):
            DrafterPush([url])(str(drafter_dir), 1)
    assert [m for m, _, _ in log] == ["GET", "GET"]  # /model_info, /server_info; nothing posted


def test_embedded_server_keeps_its_disk_draft_swap(tiny_qwen2, drafter_dir):
    with running_server(tiny_qwen2, drafter=str(drafter_dir), sd="on") as url:
        DrafterPush([url])(str(drafter_dir), 5)
        info = httpx.get(f"{url}/model_info", timeout=30).json()
    assert info["draft_weight_version"] == "5" and info["weight_version"] != "5"
