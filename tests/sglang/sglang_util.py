"""Helpers for the tests against the real SGLang engine (see conftest.py)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("GLEANRL_SGLANG_VENV", ROOT / ".venv-sglang"))
SKIP_REASON = (
    f"stock SGLang CPU install not found at {VENV}: run `bash scripts/install_sglang_cpu.sh .venv-sglang` "
    "(or `scripts/setup.sh --sglang`) to run the tests against the real engine"
)


def available() -> bool:
    return (VENV / "bin" / "python").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sglang_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(VENV / "shim"), "GLEANRL_SGLANG_PYTHON": str(VENV / "bin" / "python")}


def run_in_sglang(script: str, *args: str, timeout: float = 300):
    """Run `script` with SGLang's interpreter; it prints one JSON value on its last stdout line."""
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", script, *args],
        env=sglang_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"SGLang-side script failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def serve_args(model: Path, port: int, **kw) -> argparse.Namespace:
    base = dict(
        model=str(model),
        drafter=None,
        host="127.0.0.1",
        port=port,
        api_key=None,
        admin_api_key=None,
        device="cpu",
        dtype="auto",
        context_length=None,
        max_running_requests=8,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
        sglang_arg=[],
    )
    return argparse.Namespace(**{**base, **kw})


class SGLangServer:
    """A real SGLang server started through gleanrl's own launcher
    (`server.sglang.launch.start`)."""

    def __init__(self, model: Path, **kw):
        import pytest

        from gleanrl.server.sglang.launch import start

        if not available():
            pytest.skip(SKIP_REASON)
        os.environ["GLEANRL_SGLANG_PYTHON"] = str(VENV / "bin" / "python")
        self.model = Path(model)
        t0 = time.monotonic()
        self.process, self.url = start(serve_args(self.model, free_port(), **kw), echo=False, timeout_s=600)
        self.start_s = time.monotonic() - t0
        print(f"\n[sglang] server for {self.model.name} healthy after {self.start_s:.1f}s at {self.url}")

    def alive(self) -> bool:
        return self.process.proc.poll() is None

    def generate(self, input_ids: list[int], max_new_tokens: int = 12, **params) -> dict:
        body = {
            "input_ids": input_ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, **params},
        }
        resp = httpx.post(f"{self.url}/generate", json=body, timeout=120)
        resp.raise_for_status()
        return resp.json()

    def post(self, path: str, body: dict) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=300)

    def stop(self) -> None:
        self.process.stop()
