"""The plain decode step at long context, one query per sequence: SDPA called with one query row
(before) against `server.model.kv.sdpa` (a doubled query in bf16/fp16), in the same run, on a random
model of the `small` policy's shape (hidden 512, 6 layers, 8 heads of 64). Prints the pooled decode
attention of one layer and the whole forward, medians of interleaved repeats (docs/engine.md).

    python scripts/bench_decode_attention.py --threads 1 --dtype bf16 --running 8 --context 512
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from gleanrl.server.model import kv, kv_pool
from gleanrl.server.model.runner import ModelRunner


def ms(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--running", type=int, default=8)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    shape = dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8)
    cfg = LlamaConfig(vocab_size=512, intermediate_size=1536, max_position_embeddings=4 * a.context, **shape)
    runner = ModelRunner(LlamaForCausalLM(cfg).to(dtype).eval())
    pool = kv_pool.KVPool.for_runner(runner, slots=a.running, capacity=2 * a.context)
    caches = [pool.acquire() for _ in range(a.running)]
    for c in caches:
        runner.forward(torch.randint(0, 512, (a.context,)), torch.arange(a.context), [c], [a.context])

    def step():  # one decode token for every sequence, then back to the same context
        positions = torch.tensor([c.length for c in caches])
        runner.forward(torch.randint(0, 512, (a.running,)), positions, caches, [1] * a.running)
        for c in caches:
            c.truncate(a.context)

    plan = kv_pool.decode_plan(caches, [1] * a.running)
    q = torch.randn(a.running, 8, 64, dtype=dtype)

    def layer():
        kv_pool.pooled_decode_attention(q, q, q, plan, 0)

    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.repeats):
        for name, fn in (("before", F.scaled_dot_product_attention), ("after", kv.sdpa)):
            kv_pool.sdpa = fn
            times.setdefault(("attention, one layer", name), []).append(ms(layer, 50))
            times.setdefault(("forward", name), []).append(ms(step, 10))
    kv_pool.sdpa = kv.sdpa
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    for what in ("attention, one layer", "forward"):
        b, f = med[(what, "before")], med[(what, "after")]
        shape = f"{a.threads} thread(s) {a.dtype} {a.running} running x {a.context + 1} context"
        print(f"{shape}, {what}: before {b:.2f} ms, after {f:.2f} ms, {b / f:.2f}x")


if __name__ == "__main__":
    main()
