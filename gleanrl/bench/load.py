"""`gleanrl bench load`: many concurrent clients against a real server for a while: mixed lengths,
native and OpenAI routes, streaming and not, some clients disconnecting mid-stream.

Pass (exit 0): no errors (every request answered in full, or aborted on purpose by its client), no
leaked slots (`/server_info` back to 0 running and 0 queued), and the server's RSS growing by at most
`--rss-bound-mib` after warm-up (the first 30% of the run). Without `--url` it starts `gleanrl serve` on
`--model` (default: a tiny random model) and reads that process's RSS from /proc."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from gleanrl.bench.serve_process import ServeProcess, model_or_tiny, rss_mib, verdict

KINDS = ("native", "native_stream", "completions", "chat_stream", "disconnect")
LENGTHS = (1, 4, 16, 32, 64)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model directory (default: a tiny random Qwen2 made here)")
    p.add_argument("--url", default=None, help="a running server instead of starting one (no RSS figure)")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    p.add_argument("--max-new-tokens", type=int, default=64, help="longest request")
    p.add_argument("--rss-bound-mib", type=float, default=64.0, help="allowed RSS growth after warm-up")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the started server")
    p.add_argument("--seed", type=int, default=0, help="seed of the clients' requests")
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a further flag of the started `gleanrl serve` (repeatable; e.g. --serve-arg=--no-engine-process)",
    )
    p.add_argument("--json", default=None, help="write the summary here")
    hostile = "instead: one benign client's latency under hostile and careless requests to the server and a proxy"
    p.add_argument("--hostile", action="store_true", help=f"{hostile}, kind by kind (gleanrl/bench/hostile.py)")
    phase = "--hostile: seconds per phase (baseline, each kind, the mix)"
    p.add_argument("--phase-s", type=float, default=10.0, help=phase)
    bound = "--hostile: the mix's benign p99 may be at most this x the baseline's (or --p99-slack-ms over it)"
    p.add_argument("--p99-bound", type=float, default=2.0, help=bound)
    slack = "--hostile: the mix's benign p99 may always be this much over the baseline's"
    p.add_argument("--p99-slack-ms", type=float, default=20.0, help=slack)


async def _one(client: httpx.AsyncClient, kind: str, rng: random.Random, max_new: int, model: str) -> str:
    """One request of `kind`; returns 'ok' or 'aborted', raises on anything else."""
    n = min(rng.choice(LENGTHS), max_new)
    text = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "7", "+")) for _ in range(rng.randint(1, 40)))
    sp = {"max_new_tokens": n, "temperature": rng.choice((0.0, 0.7)), "ignore_eos": True}
    if kind == "native":
        r = await client.post("/generate", json={"text": text, "sampling_params": sp})
        r.raise_for_status()
        meta = r.json()["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == n, meta
        return "ok"
    if kind == "completions":
        body = {"model": model, "prompt": text, "max_tokens": n, "ignore_eos": True, "temperature": sp["temperature"]}
        r = await client.post("/v1/completions", json=body)
        r.raise_for_status()
        assert r.json()["usage"]["completion_tokens"] == n, r.json()
        return "ok"
    if kind == "chat_stream":
        path, messages = "/v1/chat/completions", [{"role": "user", "content": text}]
        body = {"model": model, "messages": messages, "max_tokens": n, "ignore_eos": True, "stream": True}
    else:
        path, body = "/generate", {"text": text, "sampling_params": {**sp, "max_new_tokens": max_new}, "stream": True}
    leave_after = rng.randint(1, 3) if kind == "disconnect" else None
    chunks, done = 0, False
    async with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            assert "error" not in json.loads(line[6:]), line
            chunks += 1
            if leave_after is not None and chunks >= leave_after:
                return "aborted"  # leaving the `async with` closes the connection mid-stream
    assert done and chunks >= 1, (kind, chunks, done)
    return "ok"


async def load(
    url: str, clients: int, duration: float, max_new: int = 64, seed: int = 0, rss=None, headers: dict | None = None
) -> dict:
    """Run the load; `rss()` (MiB) is sampled every 0.5 s when given. Returns the summary."""
    counts = {"ok": 0, "aborted": 0, "errors": 0}
    by_kind: dict[str, int] = {k: 0 for k in KINDS}
    errors: list[str] = []
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    end = t0 + duration
    limits = httpx.Limits(max_connections=clients * 2)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        bar = tqdm(total=None, desc="requests", unit="req", disable=None)

        async def worker(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < end:
                kind = rng.choice(KINDS)
                try:
                    counts[await _one(client, kind, rng, max_new, model)] += 1
                except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
                    counts["errors"] += 1
                    errors.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")
                by_kind[kind] += 1
                bar.update(1)

        async def sampler() -> None:
            while time.monotonic() < end:
                samples.append((time.monotonic() - t0, rss()))
                await asyncio.sleep(0.5)

        await asyncio.gather(*(worker(i) for i in range(clients)), *([sampler()] if rss else []))
        bar.close()
        drained_at = time.monotonic()
        while time.monotonic() - drained_at < 60:
            st = (await client.get("/server_info")).json()["internal_states"][0]
            if st["num_running_reqs"] == 0 and st["num_queue_reqs"] == 0:
                break
            await asyncio.sleep(0.2)
    summary = {"clients": clients, "duration_s": duration, "requests": sum(counts.values()), **counts}
    summary |= {"by_kind": by_kind, "error_samples": errors[:5], "leaked_running": st["num_running_reqs"]}
    summary |= {"leaked_queued": st["num_queue_reqs"], "req_per_s": sum(counts.values()) / duration}
    if samples:
        warm = [m for t, m in samples if t >= 0.3 * duration] or [samples[-1][1]]
        summary.update(rss_warm_mib=warm[0], rss_max_after_warm_mib=max(warm), rss_end_mib=rss())
        summary["rss_growth_mib"] = max(warm) - warm[0]
    return summary


def run(args: argparse.Namespace) -> int:
    if args.hostile:
        if args.url or args.phase_s <= 0:
            why = "--hostile starts its own server and proxy (no --url) and needs a positive --phase-s"
            print(f"gleanrl bench load: {why}", file=sys.stderr)
            return 2
        from gleanrl.bench import hostile

        return hostile.run(args)
    if args.clients < 1 or args.duration <= 0 or args.max_new_tokens < 1:
        print("gleanrl bench load: --clients, --duration and --max-new-tokens must be positive", file=sys.stderr)
        return 2
    shape = (args.clients, args.duration, args.max_new_tokens, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            summary = asyncio.run(load(args.url, *shape))
        else:
            model, extra = model_or_tiny(args.model, tmp), ["--max-running-requests", "32", *args.serve_arg]
            with ServeProcess(model, Path(tmp) / "server.log", threads=args.threads, extra=extra) as server:
                summary = asyncio.run(load(server.url, *shape, rss=lambda: rss_mib(server.pid)))
    s = summary
    ok = s["errors"] == 0 and s["leaked_running"] == 0 and s["leaked_queued"] == 0
    ok = ok and s.get("rss_growth_mib", 0.0) <= args.rss_bound_mib
    print(
        f"load: {s['clients']} clients x {s['duration_s']:.0f} s: {s['requests']} requests ({s['req_per_s']:.1f}/s), "
        f"{s['ok']} answered, {s['aborted']} aborted by their client, {s['errors']} errors; "
        f"after: {s['leaked_running']} running, {s['leaked_queued']} queued"
    )
    if "rss_growth_mib" in s:
        print(
            f"server RSS: {s['rss_warm_mib']:.0f} MiB after warm-up, max {s['rss_max_after_warm_mib']:.0f} MiB "
            f"(growth {s['rss_growth_mib']:.1f} MiB, bound {args.rss_bound_mib:.0f} MiB)"
        )
    return verdict(summary, ok, args.json)
