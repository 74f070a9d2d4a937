"""`gleanrl bench load` in CI size: 16 clients for 10 s against `gleanrl serve` in a subprocess,
mixed lengths, native and OpenAI routes, streaming and not, clients leaving mid-stream. 0 errors,
every request answered or aborted by its client, no leaked slots, server RSS flat after warm-up."""

from __future__ import annotations

import asyncio

import httpx

from gleanrl.bench.load import KINDS, load
from gleanrl.bench.serve_process import ServeProcess, rss_mib

RSS_BOUND_MIB = 64


def test_load_no_errors_no_leaks_flat_memory(tiny_qwen2, tmp_path):
    with ServeProcess(tiny_qwen2, tmp_path / "server.log", extra=["--max-running-requests", "8"]) as server:
        s = asyncio.run(
            load(server.url, clients=16, duration=10.0, max_new=32, seed=1, rss=lambda: rss_mib(server.pid))
        )
        print(s)
        assert s["errors"] == 0, s["error_samples"]
        assert s["ok"] > 0 and s["aborted"] > 0 and all(s["by_kind"][k] > 0 for k in KINDS), s
        assert s["leaked_running"] == 0 and s["leaked_queued"] == 0
        assert s["rss_growth_mib"] <= RSS_BOUND_MIB, s
        greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
        body = {"text": "After the storm", "sampling_params": greedy}
        a, b = (httpx.post(f"{server.url}/generate", json=body, timeout=60).json() for _ in range(2))
        assert a["output_ids"] == b["output_ids"] and len(a["output_ids"]) == 8
