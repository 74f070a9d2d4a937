"""The start-up check that the harvest costs the rollouts nothing: the server's decode time with and without the
harvester's kind of compute beside it (`hooks.scheduling_probe()`: a busy thread at the idle window's
priority), logged and returned for the metrics.

Why on CPU: an OpenMP team (the server's forward) waits at each kernel's barrier for its slowest worker, so a
harvester thread taking one of its cores slows the whole forward; and `nice` ranks threads only within one
scheduling group: under autogroup (`/proc/sys/kernel/sched_autogroup_enabled`) every session is a group of equal
weight, so a nice-19 harvester in another session competes at full weight (2 cores: a forward at 8 running
15 -> 130 ms). Hence the trainer starts its server in its own session (`trainer.server_proc`); others may not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from gleanrl.clients.rollout_client import RolloutClient

SLOWDOWN_WARN = 1.10  # the ratio above which the log warns


async def _decode_s(client: RolloutClient, prompt_ids: list[int], running: int, tokens: int) -> float:
    """Wall seconds of `running` concurrent greedy requests of `tokens` tokens each."""
    import asyncio

    params = {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    t0 = time.perf_counter()
    await asyncio.gather(*(client.generate(prompt_ids, params) for _ in range(running)))
    return time.perf_counter() - t0


async def check_scheduling(
    client: RolloutClient,
    prompt_ids: list[int],
    probe: Callable[[], AbstractContextManager],
    log=print,
    running: int = 4,
    tokens: int = 48,
    repeats: int = 2,
) -> dict:
    """The best of `repeats` timings alone and beside `probe()`; -> figures for the metrics."""
    await _decode_s(client, prompt_ids, running, 4)  # warm-up
    alone = min([await _decode_s(client, prompt_ids, running, tokens) for _ in range(repeats)])
    with probe():
        beside = min([await _decode_s(client, prompt_ids, running, tokens) for _ in range(repeats)])
    ratio = beside / alone
    verdict = "ok" if ratio <= SLOWDOWN_WARN else "WARNING: the harvester slows the rollouts"
    if ratio > SLOWDOWN_WARN:
        verdict += (
            f" (autogroup {_autogroup()}: a server in another session competes at full weight, start it in this one;"
            " one in this session still shares cores and memory bandwidth, give the harvester cores of its own)"
        )
    timing = f"{alone * 1e3:.0f} ms alone, {beside * 1e3:.0f} ms beside the harvester's compute ({ratio:.2f}x)"
    log(f"scheduling check: {running} x {tokens} tokens decode in {timing}: {verdict}")
    return {"sched_alone_s": alone, "sched_beside_s": beside, "sched_slowdown": ratio}


def _autogroup(
    enabled_file: str = "/proc/sys/kernel/sched_autogroup_enabled", group_file: str = "/proc/self/autogroup"
) -> str:
    """'on, this process in /autogroup-N', 'off' or 'unknown' (a container may hide or blank either file)."""
    try:
        enabled = Path(enabled_file).read_text().strip()
        group = Path(group_file).read_text().split()
    except OSError:
        return "unknown"
    if enabled == "0":
        return "off"
    return f"on, this process in {group[0]}" if enabled == "1" and group else "unknown"
