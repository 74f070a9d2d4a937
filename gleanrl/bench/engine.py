"""`gleanrl bench engine`: the rollout server's plain decoding against stock SGLang on the same CPU,
and the server's wall time per decode iteration against the same model's forward alone.

Arms, each a server process on a loopback port serving the same policy in the same dtype, sent the
same requests over HTTP (`/generate`) one arm after the other:
- `gleanrl`: `gleanrl serve --sd off`;
- `sglang`: stock SGLang CPU (`gleanrl serve --backend sglang`, from `.venv-sglang`), its KV pool
  sized for every running request at its longest (so it never retracts); skipped, with the reason,
  where it is not installed.
Per arm:
- `single_tok_s`: one request of `--single-tokens` output tokens (ignore_eos), the best
  of `--repeats`;
- `grpo_tok_s`: per step, P prompts x n samples of the built-in task at T = 1 (seeded, natural EOS,
  at most `--max-new-tokens`), all sent at once as the trainer does: output tokens / wall time;
- `iteration_ms[B]`: B requests at once (ignore_eos), the wall time per decode iteration,
  (T(L) - T(1)) / (L - 1) for requests of L output tokens, so prefill, HTTP and queueing cancel out.
`forward_ms[B]`: the decode forward of B sequences at the same context, alone in this process (the
engine's ModelRunner, the server's thread count): the floor of an iteration. Read the ratios, on
a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gleanrl.bench.sglang_arm import sglang_missing, sglang_serve_args

BUCKETS = (1, 4, 8, 16, 32, 64)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="policy directory (default: the shipped demo policy, gleanrl.shipped)"
    )
    parser.add_argument("--arms", default="gleanrl,sglang", help="comma-separated: gleanrl, sglang")
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="auto: bfloat16 on CPUs with native bf16, else float32",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the gleanrl server and the forward")
    parser.add_argument("--single-tokens", type=int, default=256, help="output tokens of the single request")
    parser.add_argument("--repeats", type=int, default=3, help="single-request runs per arm (the best counts)")
    parser.add_argument("--prompts", type=int, default=8, help="GRPO step: prompts")
    parser.add_argument("--n", type=int, default=8, help="GRPO step: samples per prompt")
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="GRPO step: the longest response")
    parser.add_argument("--buckets", default=",".join(map(str, BUCKETS)), help="running requests per bucket")
    parser.add_argument("--bucket-tokens", type=int, default=64, help="L: output tokens per bucket request")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--json", default=None, help="write the results here")


async def _generate(client, ids_list: list[list[int]], params: list[dict]) -> int:
    """All requests at once; returns the output tokens."""

    async def one(ids, sp):
        resp = await client.post("/generate", json={"input_ids": ids, "sampling_params": sp})
        resp.raise_for_status()
        return len(resp.json()["output_ids"])

    return sum(await asyncio.gather(*[one(i, p) for i, p in zip(ids_list, params)]))


def timed_requests(url: str, ids_list: list[list[int]], params: list[dict]) -> tuple[float, int]:
    """Send all requests to `url`'s /generate at once; (wall seconds, output tokens)."""
    import httpx

    async def main():
        limits = httpx.Limits(max_connections=len(ids_list) + 4)
        async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:
            start = time.perf_counter()
            tokens = await _generate(client, ids_list, params)
            return time.perf_counter() - start, tokens

    return asyncio.run(main())


def _fixed(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}


def measure_arm(url: str, args: argparse.Namespace, prompts: list[list[int]], buckets: list[int]) -> dict:
    timed_requests(url, prompts[:1], [_fixed(8)])  # warm-up
    single = max(
        n / t for t, n in (timed_requests(url, prompts[:1], [_fixed(args.single_tokens)]) for _ in range(args.repeats))
    )
    grpo = []
    for step in range(args.steps):
        ids = [p for p in prompts[: args.prompts] for _ in range(args.n)]
        sp = [
            {"max_new_tokens": args.max_new_tokens, "temperature": 1.0, "sampling_seed": 10_007 * step + i}
            for i in range(len(ids))
        ]
        t, n = timed_requests(url, ids, sp)
        grpo.append({"tok_s": round(n / t, 1), "output_tokens": n, "wall_s": round(t, 2)})
    iteration = {}
    for b in buckets:
        ids = [prompts[i % len(prompts)] for i in range(b)]
        t1, tl = (
            min(timed_requests(url, ids, [_fixed(n)] * b)[0] for _ in range(2))  # best of 2
            for n in (1, args.bucket_tokens)
        )
        iteration[b] = round(max(tl - t1, 0.0) / (args.bucket_tokens - 1) * 1e3, 2)
    return {"single_tok_s": round(single, 1), "grpo": grpo, "iteration_ms": iteration}


def forward_ms(
    model: str,
    dtype: str,
    threads: int,
    prompts: list[list[int]],
    buckets: list[int],
    context_extra: int,
    steps: int = 30,
) -> dict[int, float]:
    """Median decode-forward time of B sequences in one slot pool, each at its prompt plus
    `context_extra`."""
    import torch

    from gleanrl.server.model.kv_pool import KVPool
    from gleanrl.server.model.runner import ModelRunner

    torch.set_num_threads(threads)
    runner, out = ModelRunner.load(model, dtype=dtype), {}
    for b in buckets:
        pool = KVPool.for_runner(runner, b, 2048)
        caches = [pool.acquire() for _ in range(b)]
        for i, c in enumerate(caches):
            ids = (prompts[i % len(prompts)] * 64)[: len(prompts[i % len(prompts)]) + context_extra]
            runner.forward(torch.tensor(ids), torch.arange(len(ids)), [c], [len(ids)])
        tokens, times = torch.zeros(b, dtype=torch.long), []
        for _ in range(steps):
            positions = torch.tensor([c.length for c in caches])
            start = time.perf_counter()
            runner.forward(tokens, positions, caches, [1] * b)
            times.append(time.perf_counter() - start)
        out[b] = round(statistics.median(times) * 1e3, 2)
    return out


def _server_extra(arm: str, args: argparse.Namespace, max_running: int, longest_prompt: int) -> list[str]:
    common = ["--dtype", args.dtype, "--max-running-requests", str(max_running)]
    if arm == "sglang":
        longest = longest_prompt + max(args.max_new_tokens, args.single_tokens, args.bucket_tokens) + 8
        return [*sglang_serve_args(max_running, longest), *common]
    return ["--sd", "off", *common]


def run(args: argparse.Namespace) -> int:
    from gleanrl.bench.serve_process import ServeProcess
    from gleanrl.demo_setup import fastest_cpu_dtype

    args.dtype = fastest_cpu_dtype(args.dtype)
    arms = [a for a in args.arms.split(",") if a]
    if unknown := [a for a in arms if a not in ("gleanrl", "sglang")]:
        print(f"error: unknown arm(s) {', '.join(unknown)} (gleanrl, sglang)", file=sys.stderr)
        return 2
    from gleanrl.shipped import policy_or_shipped

    try:
        model = policy_or_shipped(args.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    from gleanrl.trainer.generate import encode_prompt
    from gleanrl.trainer.tasks import load_task

    tok = AutoTokenizer.from_pretrained(model)
    prompts = [encode_prompt(tok, s) for s in load_task(None).prompts("train", max(args.prompts, 8), args.seed)]
    buckets = [int(b) for b in args.buckets.split(",") if b]
    results: dict = {"model": model, "dtype": args.dtype, "threads": args.threads, "arms": {}, "skipped": {}}
    for arm in arms:
        if arm == "sglang" and (why := sglang_missing()):
            results["skipped"][arm] = why
            print(f"skipping arm sglang: {why}", file=sys.stderr)
            continue
        log = Path(tempfile.mkdtemp(prefix=f"gleanrl-bench-{arm}-")) / "server.log"
        print(f"arm {arm}: starting the server (log {log})", file=sys.stderr)
        max_running = max(buckets + [args.prompts * args.n])
        extra = _server_extra(arm, args, max_running, max(map(len, prompts)))
        with ServeProcess(model, log, threads=args.threads, extra=extra) as srv:
            results["arms"][arm] = measure_arm(srv.url, args, prompts, buckets)
    results["forward_ms"] = forward_ms(model, args.dtype, args.threads, prompts, buckets, args.bucket_tokens // 2)
    floor = results["forward_ms"]
    for r in results["arms"].values():
        r["iteration_over_forward"] = {b: round(ms / floor[b], 2) for b, ms in r["iteration_ms"].items()}
    if "gleanrl" in results["arms"] and "sglang" in results["arms"]:
        g, s = results["arms"]["gleanrl"], results["arms"]["sglang"]
        results["gleanrl_over_sglang"] = {
            "single": round(g["single_tok_s"] / s["single_tok_s"], 2),
            "grpo": [round(a["tok_s"] / b["tok_s"], 2) for a, b in zip(g["grpo"], s["grpo"])],
        }
    _print(results)
    if args.json:
        from gleanrl.base.atomic import atomic_file

        with atomic_file(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _print(results: dict) -> None:
    for arm, r in results["arms"].items():
        grpo = " / ".join(f"{s['tok_s']:.0f}" for s in r["grpo"])
        print(f"{arm:>8}: 1 request {r['single_tok_s']:.1f} tok/s, GRPO step {grpo} tok/s")
        for b, ms in r["iteration_ms"].items():
            print(
                f"{'':>10}{b:>3} running: {ms:7.2f} ms/iteration, forward "
                f"alone {results['forward_ms'][b]:6.2f} ms "
                f"({r['iteration_over_forward'][b]:.2f}x)"
            )
    if ratio := results.get("gleanrl_over_sglang"):
        print(
            f"gleanrl / sglang: 1 request {ratio['single']:.2f}x, GRPO step "
            + " / ".join(f"{x:.2f}x" for x in ratio["grpo"])
        )
    for arm, why in results["skipped"].items():
        print(f"{arm}: skipped ({why})")
