"""`gleanrl bench swaps` in CI size: 10 alternating target and draft swaps while 4 clients stream
greedy requests through SD. Every response carries pushed versions and equals its target version's
reference (straddlers of a target swap: the tokens streamed under the old version); 0 errors."""

from __future__ import annotations

import asyncio

from gleanrl.bench.serve_process import ServeProcess
from gleanrl.bench.swaps import make_models, swaps_under_load


def test_swaps_under_load(tmp_path):
    models = make_models(tmp_path)
    extra = ["--drafter", str(models["D1"]), "--sd", "on", "--num-draft-tokens", "3"]
    with ServeProcess(str(models["A"]), tmp_path / "server.log", extra=extra) as server:
        s = asyncio.run(swaps_under_load(server.url, models, swaps=10, clients=4, max_new=16, seed=2))
    print(s)
    assert s["errors"] == 0, s["error_samples"]
    assert s["swaps"] == 10 and s["responses"] >= 10
    assert s["responses"] > s["straddlers"]  # most responses are checked token for token
