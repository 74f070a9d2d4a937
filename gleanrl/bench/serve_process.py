"""A bench's processes and its end: `gleanrl serve` (or another `gleanrl` server command) as a subprocess on a
free loopback port, its memory and CPU time, stock SGLang as a peer arm, the summary and the verdict line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gleanrl.trainer.server_proc import free_port


def _tree(pid: int) -> list[int]:
    """`pid` and its live descendants (`gleanrl serve`'s engine process), from Linux /proc."""
    kids = [int(k) for t in Path(f"/proc/{pid}/task").glob("*/children") for k in t.read_text().split()]
    return [pid, *(p for k in kids for p in _tree(k))]


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` and its live descendants in MiB (Linux /proc)."""
    total = 0
    for p in _tree(pid):
        rss = [line for line in Path(f"/proc/{p}/status").read_text().splitlines() if line.startswith("VmRSS:")]
        if not rss:
            raise RuntimeError(f"no VmRSS for pid {p}")
        total += int(rss[0].split()[1])
    return total / 1024


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its live descendants (Linux /proc): robust to a shared machine,
    unlike wall time."""
    total = 0
    for p in _tree(pid):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def stop(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    """SIGTERM `proc` if it runs, SIGKILL it after `timeout_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class GleanrlProcess:
    """`python -m gleanrl ARGS --port P` on a free loopback port (output to `log_path`, else dropped); `with`
    waits for /health. `python`: another install's; `cwd`: where it runs (not in a checkout, for another install)."""

    def __init__(self, args: list[str], log_path: Path | None = None, python=sys.executable, env=None, cwd=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [python, "-m", "gleanrl", *args, "--port", str(self.port)]
        self.log_path, self.env, self.cwd = log_path, env or {}, cwd

    def __enter__(self):
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", **self.env)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd)
        if log is not subprocess.DEVNULL:
            log.close()
        self.pid = self.proc.pid
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.proc.poll() is None:
            if healthy(self.url):
                return self
            time.sleep(0.3)
        self.__exit__()
        raise RuntimeError(f"gleanrl {self.cmd[3]} did not start; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        stop(self.proc)


class ServeProcess(GleanrlProcess):
    """`gleanrl serve MODEL` at `threads` torch threads, `extra` its further flags."""

    def __init__(self, model: str, log_path: Path, threads: int = 1, extra: list[str] | None = None):
        flags = ["--model", str(model), "--threads", str(threads), "--log-level", "warning", *(extra or [])]
        super().__init__(["serve", *flags], log_path)


def model_or_tiny(model: str | None, tmp: str) -> str:
    """`model`, else a tiny random Qwen2 made in the folder `tmp`."""
    if model is not None:
        return model
    from gleanrl.tiny import make_tiny_model

    return str(make_tiny_model(Path(tmp) / "tiny"))


def sglang_missing() -> str | None:
    """None where stock SGLang (`.venv-sglang`) can be launched, else why not (its arm is skipped with this)."""
    from gleanrl.server.sglang.launch import SGLangLaunchError, sglang_python

    try:
        sglang_python()
    except SGLangLaunchError as exc:
        return str(exc)
    return None


def sglang_serve_args(requests: int, tokens_per_request: int) -> list[str]:
    """`gleanrl serve --backend sglang` with a KV pool for `requests` running at once at `tokens_per_request`
    (serve's CPU default for stock SGLang, 8192 tokens, would make it retract in a GRPO step and time that)."""
    return ["--backend", "sglang", f"--sglang-arg=--max-total-tokens={requests * tokens_per_request}"]


def write_json(path: str | None, results, indent: int = 2) -> None:
    """`results` as JSON to `path` (atomically), if given."""
    if path:
        from gleanrl.base.atomic import atomic_file

        with atomic_file(path, "w") as f:
            json.dump(results, f, indent=indent)


def verdict(summary: dict, ok: bool, json_path: str | None) -> int:
    """The end of a bench: its error samples on stderr, the summary to `json_path`, PASS/FAIL, exit code."""
    for e in summary["error_samples"]:
        print(f"  error: {e}", file=sys.stderr)
    write_json(json_path, summary)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
