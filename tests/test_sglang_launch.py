"""`gleanrl serve --backend sglang` without SGLang: the command it builds, and start/fail/stop
behaviour against a stand-in interpreter (a real SGLang start is in tests/sglang/)."""

from __future__ import annotations

import argparse
import socket
import stat
import sys
import textwrap
import time

import httpx
import pytest

from gleanrl.server.sglang import launch as sglang_launch
from gleanrl.server.sglang.launch import SGLangLaunchError, build_command, launch, redact, start

FAKE_SGLANG = textwrap.dedent("""
    import http.server, os, sys
    argv = sys.argv[sys.argv.index("sglang.launch_server") + 1:]
    port = int(argv[argv.index("--port") + 1])
    if os.environ.get("FAKE_MODE") == "fail":
        print("Traceback (most recent call last):", flush=True)
        print("ValueError: Unsupported architectures: ['FooForCausalLM']", flush=True)
        sys.exit(1)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    print("The server is fired up and ready to roll!", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def _args(**kw) -> argparse.Namespace:
    base = dict(
        model="/models/policy",
        drafter=None,
        host="127.0.0.1",
        port=30000,
        api_key=None,
        admin_api_key=None,
        device="cuda",
        dtype="auto",
        context_length=None,
        max_running_requests=32,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
        sglang_arg=[],
    )
    return argparse.Namespace(**{**base, **kw})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE_SGLANG)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("GLEANRL_SGLANG_PYTHON", str(python))
    return tmp_path


def test_command_for_gpu_with_drafter_and_passthrough():
    cmd = build_command(
        _args(
            drafter="/models/drafter",
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            api_key="k1",
            admin_api_key="k2",
            context_length=2048,
            tool_call_parser="qwen25",
            reasoning_parser="qwen3",
            chunked_prefill_size=512,
            sglang_arg=["--mem-fraction-static", "0.7", "--tp-size=2"],
        ),
        python="py",
    )
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"]
    pairs = dict(zip(cmd[3::2], cmd[4::2]))
    assert pairs["--model-path"] == "/models/policy" and pairs["--device"] == "cuda" and pairs["--dtype"] == "auto"
    assert pairs["--speculative-algorithm"] == "EAGLE3" and pairs["--speculative-draft-model-path"] == "/models/drafter"
    assert (
        pairs["--speculative-num-steps"],
        pairs["--speculative-eagle-topk"],
        pairs["--speculative-num-draft-tokens"],
    ) == ("3", "1", "4")
    assert pairs["--api-key"] == "k1" and pairs["--admin-api-key"] == "k2" and pairs["--context-length"] == "2048"
    assert pairs["--tool-call-parser"] == "qwen25" and pairs["--reasoning-parser"] == "qwen3"
    assert pairs["--chunked-prefill-size"] == "512"
    assert "--chunked-prefill-size" not in build_command(_args(chunked_prefill_size=1024))  # SGLang's own default
    assert cmd[-3:] == ["--mem-fraction-static", "0.7", "--tp-size=2"]
    assert "--max-total-tokens" not in cmd and "--skip-server-warmup" not in cmd
    shown = redact(cmd)
    assert "k1" not in shown and "k2" not in shown and "--api-key ***" in shown


def test_command_on_cpu_caps_the_kv_pool_unless_told():
    cmd = build_command(_args(device="cpu"), python="py")
    assert cmd[cmd.index("--max-total-tokens") + 1] == "8192" and "--skip-server-warmup" in cmd
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    cmd = build_command(_args(device="cpu", sglang_arg=["--max-total-tokens=4096"]), python="py")
    assert cmd.count("--max-total-tokens") == 0 and cmd[-1] == "--max-total-tokens=4096"
    cmd = build_command(_args(sglang_arg=["--api-key", "x"], api_key="y"), python="py")
    assert cmd.count("--api-key") == 1 and "y" not in cmd
    assert redact(["p", "--api-key=secret"]) == "p --api-key=***"


def test_sd_on_cpu_is_refused(tmp_path, capsys):
    (tmp_path / "m").mkdir(), (tmp_path / "d").mkdir()
    assert launch(_args(device="cpu", model=str(tmp_path / "m"), drafter=str(tmp_path / "d"))) == 2
    err = capsys.readouterr().err
    assert "needs a GPU" in err and "Traceback" not in err


def test_missing_model_dir_is_refused(tmp_path, capsys):
    assert launch(_args(model=str(tmp_path / "nope"))) == 2
    assert "does not exist" in capsys.readouterr().err


def test_failed_start_shows_sglangs_error(fake_sglang, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MODE", "fail")
    assert launch(_args(model=str(fake_sglang), port=_free_port())) == 2
    err = capsys.readouterr().err
    assert "exited with code 1" in err and "Unsupported architectures: ['FooForCausalLM']" in err


def test_start_waits_for_health_and_stop_ends_the_group(fake_sglang):
    port = _free_port()
    proc, url = start(_args(model=str(fake_sglang), port=port, api_key="secret"), echo=False, timeout_s=60)
    try:
        assert url == f"http://127.0.0.1:{port}" and httpx.get(f"{url}/health").status_code == 200
        # the reader thread may not have read the line when /health answers
        deadline = time.monotonic() + 30
        while "fired up" not in proc.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "--api-key" in proc.cmd and "fired up" in proc.output()
    finally:
        proc.stop()
    assert proc.proc.poll() is not None
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)


def test_no_sglang_anywhere_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("GLEANRL_SGLANG_PYTHON", raising=False)
    monkeypatch.setattr(sglang_launch, "_REPO", tmp_path)
    monkeypatch.setattr(sglang_launch, "_importable", lambda name: False)
    with pytest.raises(SGLangLaunchError, match="not installed"):
        sglang_launch.sglang_python()
