"""A bench's server and its end: `gleanrl serve` as a subprocess on a free loopback port
(`ServeProcess`), its resident memory, and the verdict line every pass/fail bench ends with."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gleanrl.trainer.server_proc import free_port


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class ServeProcess:
    """`gleanrl serve MODEL` as a subprocess on a free loopback port; `with` waits for /health."""

    def __init__(self, model: str, log_path: Path, threads: int = 1, extra: list[str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "gleanrl", "serve", "--model", str(model), "--port", str(self.port)]
        self.cmd += ["--threads", str(threads), "--log-level", "warning", *(extra or [])]
        self.log_path = log_path

    def __enter__(self) -> ServeProcess:
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.3)
        self.__exit__()
        raise RuntimeError(f"server did not start; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def verdict(summary: dict, ok: bool, json_path: str | None) -> int:
    """The end of a bench: its error samples on stderr, the summary to `json_path`, PASS/FAIL, exit code."""
    for e in summary["error_samples"]:
        print(f"  error: {e}", file=sys.stderr)
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
