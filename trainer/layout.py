"""The rollouts laid out on the cores as this hardware pays: one embedded server (replica) per group of
cores, each pinned to its group with one torch thread per core, behind the client's spread (a
prompt's samples to one replica, so its group drafts see its siblings).

Why replicas on CPU: when one replica has nothing left to run and another still decodes its tail,
that replica's cores are the harvest's (`IdleCores`): the CPU analog of a GPU cluster's rollout
devices whose rollouts finished, never a busy core shared at low priority. What it costs: on the
2-core AMX host a GRPO step's rollouts ran at 0.75x the tokens per second of one two-thread server
(a prompt group's tail stays on one single-thread replica), so the default (`layout_groups`) takes
replicas only when a harvest needs the cores. The policy update (no rollout runs) takes every core;
weight updates go to every replica.
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
    """Embedded servers, one per core group, each pinned there (`EmbeddedServer(cores=...)`);
    started, checked, restarted and stopped together."""

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
        many = len(groups) > 1
        self.servers = [
            EmbeddedServer(
                model,
                threads or len(cores),
                settings,
                api_key,
                admin_api_key,
                _numbered(log_path, i) if many else log_path,
                sd,
                cores=cores,
            )
            for i, cores in enumerate(groups)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def cores(self) -> dict[str, set[int]]:
        return {s.url: set(s.cores or ()) for s in self.servers}

    @property
    def log_path(self) -> Path | None:
        return self.servers[0].log_path

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
    """The cores of the replicas with nothing in flight while another still has work: a `CoreGate`
        for the harvest's idle window (`harvest.idle`). A replica counts as idle once it has had
        nothing in flight for `settle_s` while another had work (a step's requests reach the replicas a
    few event-loop ticks apart).
        `in_flight(url)` is the client's count of requests in flight to `url`."""

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
    """The embedded servers' core groups: `replicas` of them. 0: as measured to pay (docs/e2e.md,
    "Layout"): with a harvest on CPU, one per core (the harvest then gets the cores of replicas that
    finished); without one, one server over every core (its rollouts ran 1.34x the replicas' tokens
    per second on the AMX host, 2026-12-04); on CUDA or with stock SGLang, whose own scheduler uses
    the device, one. A single server beside a harvester takes the first half of the cores and leaves
    it the rest."""
    from gleanrl.trainer.phases import all_cores

    cores = sorted(all_cores())
    if replicas == 0:
        on_cpu = serve.get("device", "cpu") == "cpu" and serve.get("backend", "embedded") == "embedded"
        replicas = len(cores) if on_cpu and harvests else 1
    if replicas == 1 and harvests and len(cores) > 1:
        return [set(cores[: len(cores) // 2])]
    return core_groups(cores, replicas)
