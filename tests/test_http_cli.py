"""`gleanrl serve`: clear one-line errors with exit status 2, and a real served model
over the CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from gleanrl.cli import main
from serving import wait_until

ROOT = Path(__file__).resolve().parents[1]


def test_missing_or_unloadable_model_is_one_line_exit_2(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path / "nope")]) == 2
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "qwen2"')
    assert main(["serve", "--model", str(bad)]) == 2
    assert main(["serve", "--model", str(bad), "--max-running-requests", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("gleanrl serve: error: ") for line in err)
    assert "Traceback" not in "".join(err) and "nope" in err[0] and "bad" in err[1] and "max_running_requests" in err[2]


def test_sglang_only_flags_are_refused_by_the_embedded_backend(tiny_qwen2, capsys):
    assert main(["serve", "--model", str(tiny_qwen2), "--speculative-num-steps", "3", "--sglang-arg=--tp-size=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("gleanrl serve: error: --speculative-num-steps, --sglang-arg: --backend sglang only")
        and "\n" not in err
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_answers_and_keeps_the_key_out_of_the_logs(tiny_qwen2, tmp_path):
    port, key = _free_port(), "sk-never-print-me"
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from gleanrl.cli import main; sys.exit(main())",
            "serve",
            "--model",
            str(tiny_qwen2),
            "--port",
            str(port),
            "--threads",
            "1",
            "--api-key",
            key,
            "--served-model-name",
            "cli-model",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up():
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_until(up, timeout=120), (tmp_path / "serve.log").read_text()
        headers = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{url}/v1/models", headers=headers).json()["data"][0]["id"] == "cli-model"
        r = httpx.post(
            f"{url}/generate",
            headers=headers,
            timeout=60,
            json={"text": "hi", "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}},
        )
        assert r.json()["meta_info"]["completion_tokens"] == 3
        assert httpx.post(f"{url}/generate", json={"text": "hi"}).status_code == 401
    finally:
        proc.terminate()
        proc.wait(30)
    text = (tmp_path / "serve.log").read_text()
    assert key not in text and "/generate" in text  # the access log is on, the key is not in it
