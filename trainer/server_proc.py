"""One embedded rollout server, as the trainer starts it without `--server`: `gleanrl serve` as a subprocess on a
free loopback port, pinned to `cores` if given, restarted if it dies, in the trainer's session (so that nice
ranks the harvester below it). `trainer.layout.Replicas` runs one per core group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

SD_MODES = ("off", "on", "adaptive")  # `gleanrl serve --sd`


def _child_setup(cores: frozenset[int] | None) -> Callable[[], None]:
    """Runs in the child before exec: pin to `cores` (inherited by its threads); (Linux) SIGTERM it when the
    trainer dies, even by kill -9."""

    def setup() -> None:
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return setup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class ServeSD:
    """The embedded server's speculative decoding: the drafter it serves and its `sd` mode."""

    drafter: str
    sd: str = "adaptive"

    def __post_init__(self) -> None:
        if self.sd not in SD_MODES:
            raise ValueError(f"sd mode must be one of {', '.join(SD_MODES)}, got {self.sd!r}")

    def settings(self) -> dict:
        return {"drafter": str(self.drafter), "sd": self.sd}


class EmbeddedServer:
    """`settings`: `gleanrl serve` settings by flag name (`dtype`, `sd_sources`, ...), over those of `sd`, handed
    over as a JSON file (`--config`). `cores`: the CPU cores it runs on (None: the trainer's)."""

    def __init__(
        self,
        model: str,
        threads: int = 1,
        settings: dict | None = None,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        log_path: str | Path | None = None,
        sd: ServeSD | None = None,
        cores: Collection[int] | None = None,
    ):
        self.model, self.threads, self.extra = model, threads, dict(settings or {})
        self.cores = frozenset(cores) if cores else None
        self.sd = sd
        self.api_key, self.admin_api_key = api_key, admin_api_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else None
        self.config_path = Path(tempfile.gettempdir()) / f"gleanrl-serve-{os.getpid()}-{self.port}.json"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    def settings(self) -> dict:
        """What the server is started with; keys go by environment (start), never in the file."""
        sd = self.sd.settings() if self.sd else {}
        return {
            "model": self.model,
            "host": "127.0.0.1",
            "port": self.port,
            "threads": self.threads,
            **sd,
            **self.extra,
        }

    def command(self) -> list[str]:
        from gleanrl.base.atomic import atomic_file

        with atomic_file(self.config_path, "w") as f:
            json.dump(self.settings(), f)
        return [sys.executable, "-m", "gleanrl", "serve", "--config", str(self.config_path)]

    def start(self) -> None:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        keys = {"GLEANRL_API_KEY": self.api_key, "GLEANRL_ADMIN_API_KEY": self.admin_api_key}
        for name, key in keys.items():  # exactly the trainer's keys, not the shell's
            env.pop(name, None) if key is None else env.__setitem__(name, key)
        # its own process group (Ctrl-C reaches the trainer, which stops it), but the trainer's session: under
        # autogroup scheduling (Linux's default) a new session is a new group, where the harvester's `nice`
        # no longer ranks it below the server (docs/e2e.md, "Scheduling")
        setup = _child_setup(self.cores)
        out = {"stdout": log, "stderr": subprocess.STDOUT}
        self.proc = subprocess.Popen(self.command(), **out, env=env, process_group=0, preexec_fn=setup)
        if log is not subprocess.DEVNULL:
            log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_running(self) -> bool:
        """Restart the server if it exited (same port). True when a restart happened."""
        if self.alive():
            return False
        self.restarts += 1
        self.start()
        return True

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self.config_path.unlink(missing_ok=True)
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
