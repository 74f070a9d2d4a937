"""The rollouts laid out on the cores: one embedded server (replica) per core group, pinned there with one torch
thread per core, behind the client's spread (a prompt's samples to one replica, so its group drafts see its siblings).
When one replica is done while another decodes its tail, its cores are the harvest's (`IdleCores`): the CPU analog of
finished GPU rollout devices, never a busy core at low priority. Cost: on the 2-core AMX host rollouts ran at 0.75x the
tokens/s of one two-thread server, so `layout_groups` takes replicas only for a harvest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gleanrl.trainer.server_proc import EmbeddedServer, ServeSD


def core_groups(cores: Sequence[int], replicas: int) -> list[set[int]]:
    """`cores` split into `replicas` contiguous groups as even as they come (the first ones larger)."""
    cores = sorted(cores)
    if not 1 <= replicas <= len(cores):
        raise ValueError(f"replicas must be in [1, {len(cores)}] (the cores this process may use), got {replicas}")
    size, extra = divmod(len(cores), replicas)
    groups, at = [], 0
    for i in range(replicas):
        n = size + (i < extra)
        groups.append(set(cores[at : at + n]))
        at += n
    return groups


class Replicas:
    """Embedded servers, one per core group, pinned there; started, checked, restarted and stopped together."""

    def __init__(
        self,
        model: str,
        groups: list[set[int]],
        settings: dict | None = None,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        log_path: str | Path | None = None,
        sd: ServeSD | None = None,
        threads: int | None = None,
    ):
        logs = [_numbered(log_path, i) if len(groups) > 1 else log_path for i in range(len(groups))]
        self.servers = [
            EmbeddedServer(model, threads or len(cores), settings, api_key, admin_api_key, log, sd, cores=cores)
            for cores, log in zip(groups, logs)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def cores(self) -> dict[str, set[int]]:
        return {s.url: set(s.cores or ()) for s in self.servers}

    def start(self) -> None:
        for s in self.servers:
            s.start()

    def alive(self) -> bool:
        return all(s.alive() for s in self.servers)

    def ensure_running(self) -> bool:
        """Restart the replicas that exited (same ports). True when one was restarted."""
        return any([s.ensure_running() for s in self.servers])

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(f"[{s.log_path}]\n{tail}" for s in self.servers if (tail := s.log_tail(lines)))

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def _numbered(path: str | Path | None, i: int) -> Path | None:
    if path is None:
        return None
    path = Path(path)
    return path.with_name(f"{path.stem}.{i}{path.suffix}")


class IdleCores:
    """A `CoreGate` (`harvest.idle`): the cores of replicas with nothing in flight (`in_flight(url)`, the
    client's count) for `settle_s` while another has work (requests reach replicas a few ticks apart)."""

    def __init__(
        self,
        in_flight: Callable[[str], int],
        cores: dict[str, set[int]],
        settle_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.in_flight, self.cores, self.settle_s, self.clock = in_flight, cores, settle_s, clock
        self._idle_since: dict[str, float] = {}

    def __call__(self) -> set[int] | None:
        now, busy, free = self.clock(), False, set()
        for url, cores in self.cores.items():
            if self.in_flight(url) > 0:
                busy = True
                self._idle_since.pop(url, None)
            elif now - self._idle_since.setdefault(url, now) >= self.settle_s:
                free |= cores
        if not busy:  # nothing runs anywhere (between steps): no tail, and the clocks start over
            self._idle_since.clear()
            return None
        return free or None


def layout_groups(replicas: int, serve: dict, harvests: bool) -> list[set[int]]:
    """`replicas` core groups. 0: as measured to pay (docs/e2e.md, "Layout"): with a harvest on CPU, one per core;
    without, one server over every core (1.34x the replicas' tokens/s on the AMX host); on CUDA or stock
    SGLang, one. A single server beside a harvester takes the first half of the cores."""
    from gleanrl.trainer.phases import all_cores

    cores = sorted(all_cores())
    if replicas == 0:
        on_cpu = serve.get("device", "cpu") == "cpu" and serve.get("backend", "embedded") == "embedded"
        replicas = len(cores) if on_cpu and harvests else 1
    if replicas == 1 and harvests and len(cores) > 1:
        return [set(cores[: len(cores) // 2])]
    return core_groups(cores, replicas)
