"""`gleanrl serve --backend sglang`: build and run stock SGLang's launch command from gleanrl's flags.

The SGLang interpreter is `$GLEANRL_SGLANG_PYTHON`, else `.venv-sglang/bin/python` beside this checkout (the CPU test
install, `scripts/install_sglang_cpu.sh`), else the current interpreter if it can import sglang. On CPU, SGLang's KV
pool is capped (`--max-total-tokens 8192`, else it takes ~20 GB) and its warmup is skipped unless the pass-through
arguments say otherwise; SD is refused on CPU because SGLang 0.5.23's EAGLE-3 worker needs a GPU. API keys travel as
SGLang's own flags (SGLang reads no environment variable for them), so they are visible in the process list of the
machine; they are redacted in everything gleanrl prints."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import signal
import sys
from pathlib import Path

from gleanrl.server.config import EngineConfig
from gleanrl.server.sglang.process import SGLangLaunchError, SGLangProcess

__all__ = ["SGLangLaunchError", "SGLangProcess", "build_command", "launch", "redact", "start"]
_REPO = Path(__file__).resolve().parents[2]  # server/sglang/launch.py -> the checkout
_SECRET_FLAGS = ("--api-key", "--admin-api-key")


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
