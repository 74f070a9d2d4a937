"""A running stock SGLang server process: its own process group (in the caller's session, so that a harvester's nice
ranks below it under autogroup scheduling), the tail of its output kept so a failed start can show SGLang's error."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import httpx


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
