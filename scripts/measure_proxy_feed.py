"""Measure (1) the latency `gleanrl proxy` adds per request and (2) the embedded server's speed with
the harvest feed off vs on. Servers run as `gleanrl serve` subprocesses (1 torch thread each) on a
tiny random Qwen2; requests alternate between the arms so that a busy machine slows both alike.

    .venv/bin/python scripts/measure_proxy_feed.py [--requests 60] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from gleanrl.bench.engine import timed_requests
from gleanrl.bench.serve_process import GleanrlProcess, cpu_s


def start(stack: ExitStack, args: list[str], python: str = sys.executable) -> tuple[int, str]:
    """`gleanrl ARGS` (of `python`'s install: run outside the checkout) at one thread; (pid, url)."""
    proc = stack.enter_context(GleanrlProcess(args, python=python, env={"OMP_NUM_THREADS": "1"}, cwd="/"))
    return proc.pid, proc.url


def latency(http: httpx.Client, url: str, path: str, body: dict | None) -> float:
    t0 = time.perf_counter()
    resp = http.post(url + path, json=body) if body is not None else http.get(url + path)
    resp.raise_for_status()
    return (time.perf_counter() - t0) * 1000


def throughput(url: str, n: int = 16, tokens: int = 64) -> float:
    """Output tokens/s of `n` greedy requests of `tokens` tokens sent at once."""
    params = {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    return n * tokens / timed_requests(url, [[5, 6, 7]] * n, [params] * n)[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--rounds", type=int, default=6)
    baseline = "also a server from another install (e.g. /work/main/.venv/bin/python: code without the feed)"
    p.add_argument("--baseline-python", default=None, help=baseline)
    a = p.parse_args()
    from gleanrl.tiny import make_tiny_model

    model = make_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    serve = ["serve", "--model", str(model), "--threads", "1", "--sd", "off", "--log-level", "warning"]
    with ExitStack() as stack:
        off, url_off = start(stack, serve)
        on, url_on = start(stack, serve + ["--harvest-feed", "--admin-api-key", "measure"])  # the feed needs a key
        proxy, url_px = start(stack, ["proxy", "--upstream", url_off, "--admin-api-key", "measure"])
        arms = {"feed off": (off, url_off), "feed on": (on, url_on)}
        if a.baseline_python:
            arms = {"baseline": start(stack, serve, a.baseline_python)} | arms
        gen = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}}
        cases = {"generate (8 tokens)": ("/generate", gen), "model_info": ("/model_info", None)}
        with httpx.Client(timeout=60) as http:
            for name, (path, body) in cases.items():
                for u in (url_off, url_px):
                    latency(http, u, path, body)  # warm up connections and code paths
                direct, relayed, c0 = [], [], cpu_s(proxy)
                for _ in range(a.requests):
                    direct.append(latency(http, url_off, path, body))
                    relayed.append(latency(http, url_px, path, body))
                added = [r - d for r, d in zip(relayed, direct)]
                med = statistics.median
                print(
                    f"{name:20s} direct p50 {med(direct):7.2f} ms  via proxy p50 {med(relayed):7.2f} ms  added p50 "
                    f"{med(added):6.2f} ms (mean {statistics.mean(added):6.2f} ms, n={a.requests}); proxy CPU "
                    f"{(cpu_s(proxy) - c0) / a.requests * 1000:.2f} ms/request"
                )
        speeds: dict[str, list[float]] = {k: [] for k in arms}
        cpu = {k: 0.0 for k in arms}
        for _ in range(a.rounds):
            for name, (proc, url) in arms.items():
                c0 = cpu_s(proc)
                speeds[name].append(throughput(url))
                cpu[name] += cpu_s(proc) - c0
        med = {k: statistics.median(v) for k, v in speeds.items()}
        speed = ", ".join(f"{k} {v:.0f} tok/s ({v / med['feed off']:.3f}x feed off)" for k, v in med.items())
        print(f"throughput 16x64 tokens (median of {a.rounds} alternating rounds): {speed}")
        tokens = a.rounds * 16 * 64
        print("server CPU per generated token: " + ", ".join(f"{k} {cpu[k] / tokens * 1000:.3f} ms" for k in arms))


if __name__ == "__main__":
    main()
