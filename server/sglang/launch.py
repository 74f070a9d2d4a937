"""`gleanrl serve --backend sglang`: stock SGLang's launch command from gleanrl's flags, run in its own process group
(in the caller's session: a harvester's nice ranks below it under autogroup), its output's tail kept for a failed start.

The interpreter: `$GLEANRL_SGLANG_PYTHON`, else `.venv-sglang/bin/python` beside this checkout (the CPU test install,
`scripts/install_sglang_cpu.sh`), else this one if it imports sglang. On CPU, SGLang's KV pool is capped
(`--max-total-tokens 8192`, else ~20 GB) and its warmup skipped unless the pass-through arguments say otherwise; SD is
refused on CPU (SGLang 0.5.23's EAGLE-3 worker needs a GPU). API keys travel as SGLang's own flags (it reads no
environment variable for them), so the process list shows them; everything gleanrl prints redacts them."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from gleanrl.server.config import EngineConfig

_REPO = Path(__file__).resolve().parents[2]  # server/sglang/launch.py -> the checkout
_SECRET_FLAGS = ("--api-key", "--admin-api-key")


class SGLangLaunchError(RuntimeError):
    """SGLang could not be started; the message holds SGLang's own last output."""


class SGLangProcess:
    def __init__(self, cmd: list[str], env: dict[str, str], echo: bool = True, tail_lines: int = 60):
        self.cmd, self.tail = cmd, collections.deque(maxlen=tail_lines)
        self.proc = subprocess.Popen(
            cmd,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=0,
            text=True,
            errors="replace",
        )
        self._reader = threading.Thread(target=self._pump, args=(echo,), daemon=True)
        self._reader.start()

    def _pump(self, echo: bool) -> None:
        for line in self.proc.stdout:
            self.tail.append(line.rstrip("\n"))
            if echo:
                sys.stderr.write(line)

    def output(self) -> str:
        return "\n".join(self.tail)

    def wait_healthy(self, url: str, timeout_s: float) -> float:
        """Seconds until /health answered 200; raises SGLangLaunchError with SGLang's output otherwise."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                raise SGLangLaunchError(
                    f"SGLang exited with code {self.proc.returncode} while starting; its last output:\n{self.output()}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SGLangLaunchError(
            f"SGLang did not become healthy within {timeout_s:.0f}s; its last output:\n{self.output()}"
        )

    def stop(self, grace_s: float = 15.0) -> None:
        """Terminate the whole process group SGLang started (scheduler and detokenizer included)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=grace_s)
            except ProcessLookupError:
                pass
        try:  # children outlive a leader that died first (e.g. after a crash)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def sglang_python() -> tuple[str, dict[str, str]]:
    """(interpreter, extra environment) for running SGLang."""
    explicit = os.environ.get("GLEANRL_SGLANG_PYTHON")
    venv_python = _REPO / ".venv-sglang" / "bin" / "python"
    if explicit:
        if not Path(explicit).exists():
            raise SGLangLaunchError(f"GLEANRL_SGLANG_PYTHON={explicit} does not exist")
        python = explicit
    elif venv_python.exists():
        python = str(venv_python)
    elif _importable("sglang.launch_server"):
        python = sys.executable
    else:
        raise SGLangLaunchError(
            "SGLang is not installed: `pip install 'sglang[all]>=0.5.23'` on a GPU machine, or `bash "
            "scripts/install_sglang_cpu.sh .venv-sglang` for the CPU test engine (or point GLEANRL_SGLANG_PYTHON at an "
            "interpreter that has it)"
        )
    shim = Path(python).parent.parent / "shim"  # the CPU install's vllm stub (see install_sglang_cpu.sh)
    if not shim.is_dir():
        return python, {}
    return python, {"PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))}


def _unless_default(args: argparse.Namespace, name: str):
    """An embedded-engine setting SGLang also has, passed on only when set to other than gleanrl's
    default: SGLang picks its own from the GPU (e.g. its chunked prefill size by memory)."""
    default = next(f.default for f in dataclasses.fields(EngineConfig) if f.name == name)
    value = getattr(args, name, None)
    return None if value == default else value


def build_command(args: argparse.Namespace, python: str = "python") -> list[str]:
    """SGLang's launch command for gleanrl serve's flags (pure: no checks of the machine)."""
    extra = list(getattr(args, "sglang_arg", None) or [])
    given = {a.split("=", 1)[0] for a in extra if a.startswith("--")}
    device = args.device
    dtype = {"auto": "float32" if device == "cpu" else "auto"}.get(args.dtype, args.dtype)
    cmd = [python, "-m", "sglang.launch_server", "--model-path", str(args.model)]
    cmd += ["--host", args.host, "--port", str(args.port), "--device", device, "--dtype", dtype]
    optional = [
        ("--context-length", args.context_length),
        ("--max-running-requests", args.max_running_requests),
        ("--api-key", args.api_key),
        ("--admin-api-key", args.admin_api_key),
        ("--reasoning-parser", getattr(args, "reasoning_parser", None)),
        ("--tool-call-parser", getattr(args, "tool_call_parser", None)),
        ("--chunked-prefill-size", _unless_default(args, "chunked_prefill_size")),
    ]
    if args.drafter:
        optional += [
            ("--speculative-algorithm", "EAGLE3"),
            ("--speculative-draft-model-path", str(args.drafter)),
            ("--speculative-num-steps", args.speculative_num_steps),
            ("--speculative-eagle-topk", args.speculative_eagle_topk),
            ("--speculative-num-draft-tokens", args.speculative_num_draft_tokens),
        ]
    for flag, value in optional:
        if value is not None and flag not in given:
            cmd += [flag, str(value)]
    if device == "cpu":
        cmd += [] if "--max-total-tokens" in given else ["--max-total-tokens", "8192"]
        cmd += [] if "--skip-server-warmup" in given else ["--skip-server-warmup"]
    return cmd + extra


def redact(cmd: list[str]) -> str:
    shown = [("***" if i and cmd[i - 1] in _SECRET_FLAGS else a) for i, a in enumerate(cmd)]
    return " ".join(a.split("=", 1)[0] + "=***" if a.startswith(_SECRET_FLAGS) and "=" in a else a for a in shown)


def check_args(args: argparse.Namespace) -> None:
    if args.drafter and args.device == "cpu":
        raise SGLangLaunchError(
            "speculative decoding with stock SGLang needs a GPU (SGLang 0.5.23's EAGLE-3 worker does not run on CPU): "
            "drop --drafter, use --device cuda, or use --backend embedded, which runs SD on CPU"
        )
    if not Path(args.model).is_dir():
        raise SGLangLaunchError(f"model directory {args.model} does not exist")
    if args.drafter and not Path(args.drafter).is_dir():
        raise SGLangLaunchError(f"drafter directory {args.drafter} does not exist")


def start(args: argparse.Namespace, echo: bool = True, timeout_s: float = 600.0) -> tuple[SGLangProcess, str]:
    """Check the flags, start SGLang, wait for /health; returns (process, base URL)."""
    check_args(args)
    python, env = sglang_python()
    cmd = build_command(args, python)
    print(f"starting SGLang: {redact(cmd)}", file=sys.stderr)
    proc = SGLangProcess(cmd, env, echo=echo)
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = f"http://{host}:{args.port}"
    try:
        took = proc.wait_healthy(url, timeout_s)
    except BaseException:
        proc.stop()
        raise
    print(f"SGLang is serving {args.model} at {url} (healthy after {took:.1f}s)", file=sys.stderr)
    return proc, url


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # runs the `finally` below, so SGLang's process group is stopped too


def launch(args: argparse.Namespace) -> int:
    """Run SGLang in the foreground until it exits or gleanrl is interrupted; returns an exit code."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        proc, _ = start(args)
    except SGLangLaunchError as exc:
        print(f"gleanrl serve --backend sglang: {exc}", file=sys.stderr)
        return 2
    try:
        return proc.proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        proc.stop()
