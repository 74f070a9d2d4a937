"""`gleanrl bench engine`: the rollout server's plain decoding against stock SGLang (`sglang`, skipped with the
reason where `.venv-sglang` is missing), both `gleanrl serve` processes sent the same requests over HTTP: one
request (`single_tok_s`), a GRPO step (`grpo_tok_s`) and the wall time per decode iteration at B running
(`iteration_ms[B]`: (T(L) - T(1)) / (L - 1), so prefill, HTTP and queueing cancel), against the decode forward
alone in this process (`forward_ms[B]`, the floor). Read the ratios."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gleanrl.bench.serve_process import ServeProcess, sglang_missing, sglang_serve_args, write_json

BUCKETS = (1, 4, 8, 16, 32, 64)


ARMS = ("gleanrl", "gleanrl_embedded", "gleanrl_paced", "sglang")


def add_shared(add, buckets: tuple[int, ...], bucket_tokens: int) -> None:
    """The flags `bench engine` and `bench layout` share: the policy, its dtype, the iteration buckets, a GRPO step."""
    add("--model", default=None, help="policy directory (default: the shipped demo policy, gleanrl.shipped)")
    dtype = "auto: bfloat16 on CPUs with native bf16, else float32"
    add("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help=dtype)
    add("--buckets", default=",".join(map(str, buckets)), help="running requests per iteration bucket")
    add("--bucket-tokens", type=int, default=bucket_tokens, help="L: output tokens per bucket request")
    add("--prompts", type=int, default=8, help="GRPO step: prompts")
    add("--n", type=int, default=8, help="GRPO step: samples per prompt")
    add("--max-new-tokens", type=int, default=512, help="GRPO step: the longest response")
    add("--seed", type=int, default=0, help="sampling seed")
    add("--json", default=None, help="write the results here")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add_shared(add, BUCKETS, bucket_tokens=64)
    arms = (
        "comma-separated, repeats allowed (run in that order): gleanrl, gleanrl_embedded (--no-engine-process), "
        "gleanrl_paced (--prefill-share 0.33), sglang"
    )
    add("--arms", default="gleanrl,sglang", help=arms)
    add("--threads", type=int, default=2, help="torch threads of the gleanrl server and the forward")
    add("--single-tokens", type=int, default=256, help="output tokens of the single request")
    add("--repeats", type=int, default=3, help="single-request runs per arm (the best counts)")
    add("--steps", type=int, default=2, help="GRPO steps")


def timed_requests(url, ids: list[list[int]], params: list[dict]) -> tuple[float, int]:
    """Send every request at once to `url`'s /generate (request i to `url(i)`'s where `url` is a function);
    (wall seconds, output tokens)."""
    import httpx

    url_of = url if callable(url) else lambda i: url

    async def main() -> tuple[float, int]:
        async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_connections=len(ids) + 4)) as client:

            async def one(i: int) -> int:
                body = {"input_ids": ids[i], "sampling_params": params[i]}
                resp = await client.post(f"{url_of(i)}/generate", json=body)
                resp.raise_for_status()
                return len(resp.json()["output_ids"])

            start = time.perf_counter()
            tokens = sum(await asyncio.gather(*[one(i) for i in range(len(ids))]))
            return time.perf_counter() - start, tokens

    return asyncio.run(main())


def fixed(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}


def iteration_ms(url: str, prompts: list[list[int]], b: int, tokens: int, digits: int = 2) -> float:
    """Wall ms per decode iteration with `b` requests running: (T(L) - T(1)) / (L - 1), best of 2 each."""
    ids = [prompts[i % len(prompts)] for i in range(b)]
    t1, tl = (min(timed_requests(url, ids, [fixed(n)] * b)[0] for _ in range(2)) for n in (1, tokens))
    return round(max(tl - t1, 0.0) / (tokens - 1) * 1e3, digits)


def grpo_step(url, prompts: list[list[int]], args: argparse.Namespace, step: int) -> tuple[float, int]:
    """A GRPO step's requests (`args.n` of each of the first `args.prompts` prompts, T = 1, seeded per step and
    sample) sent at once as `timed_requests` sends them; (wall seconds, output tokens)."""
    ids = [p for p in prompts[: args.prompts] for _ in range(args.n)]
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 1.0}
    return timed_requests(url, ids, [params | {"sampling_seed": 10_007 * step + i} for i in range(len(ids))])


def measure_arm(url: str, args: argparse.Namespace, prompts: list[list[int]], buckets: list[int]) -> dict:
    timed_requests(url, prompts[:1], [fixed(8)])  # warm-up
    runs = (timed_requests(url, prompts[:1], [fixed(args.single_tokens)]) for _ in range(args.repeats))
    single = max(n / t for t, n in runs)
    steps = (grpo_step(url, prompts, args, step) for step in range(args.steps))
    grpo = [{"tok_s": round(n / t, 1), "output_tokens": n, "wall_s": round(t, 2)} for t, n in steps]
    iteration = {b: iteration_ms(url, prompts, b, args.bucket_tokens) for b in buckets}
    return {"single_tok_s": round(single, 1), "grpo": grpo, "iteration_ms": iteration}


def forward_ms(
    model: str, dtype: str, threads: int, prompts: list[list[int]], buckets: list[int], context_extra: int
) -> dict[int, float]:
    """Median decode-forward ms of B sequences in one slot pool, each at its prompt plus `context_extra`."""
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
        for _ in range(30):
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
    own = {"gleanrl_embedded": ["--no-engine-process"], "gleanrl_paced": ["--prefill-share", "0.33"]}.get(arm, [])
    return ["--sd", "off", *own, *common]


def task_prompts(model: str, task: str | None, n: int, seed: int) -> list[list[int]]:
    """`n` train prompts of `task` (None: the built-in one), encoded as the trainer sends them."""
    from transformers import AutoTokenizer

    from gleanrl.trainer.generate import encode_prompt
    from gleanrl.trainer.tasks import load_task

    tok = AutoTokenizer.from_pretrained(model)
    return [encode_prompt(tok, s) for s in load_task(task).prompts("train", n, seed)]


def run(args: argparse.Namespace) -> int:
    from gleanrl.demo_setup import fastest_cpu_dtype
    from gleanrl.shipped import policy_or_shipped

    args.dtype = fastest_cpu_dtype(args.dtype)
    arms = [a for a in args.arms.split(",") if a]
    try:
        if unknown := [a for a in arms if a not in ARMS]:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)} ({', '.join(ARMS)})")
        model = policy_or_shipped(args.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prompts = task_prompts(model, None, max(args.prompts, 8), args.seed)
    buckets = [int(b) for b in args.buckets.split(",") if b]
    results: dict = {"model": model, "dtype": args.dtype, "threads": args.threads, "arms": {}, "skipped": {}}
    for i, arm in enumerate(arms):
        name = arm if arm not in arms[:i] else f"{arm}#{arms[:i].count(arm) + 1}"  # a repeat: the noise floor
        if arm == "sglang" and (why := sglang_missing()):
            results["skipped"][arm] = why
            print(f"skipping arm sglang: {why}", file=sys.stderr)
            continue
        log = Path(tempfile.mkdtemp(prefix=f"gleanrl-bench-{arm}-")) / "server.log"
        print(f"arm {arm}: starting the server (log {log})", file=sys.stderr)
        max_running = max(buckets + [args.prompts * args.n])
        extra = _server_extra(arm, args, max_running, max(map(len, prompts)))
        with ServeProcess(model, log, threads=args.threads, extra=extra) as srv:
            results["arms"][name] = measure_arm(srv.url, args, prompts, buckets)
    floor = forward_ms(model, args.dtype, args.threads, prompts, buckets, args.bucket_tokens // 2)
    results["forward_ms"] = floor
    for r in results["arms"].values():
        r["iteration_over_forward"] = {b: round(ms / floor[b], 2) for b, ms in r["iteration_ms"].items()}
    if "gleanrl" in results["arms"] and "sglang" in results["arms"]:
        g, s = results["arms"]["gleanrl"], results["arms"]["sglang"]
        results["gleanrl_over_sglang"] = {
            "single": round(g["single_tok_s"] / s["single_tok_s"], 2),
            "grpo": [round(a["tok_s"] / b["tok_s"], 2) for a, b in zip(g["grpo"], s["grpo"])],
        }
    _print(results)
    write_json(args.json, results)
    return 0


def _print(results: dict) -> None:
    for arm, r in results["arms"].items():
        grpo = " / ".join(f"{s['tok_s']:.0f}" for s in r["grpo"])
        print(f"{arm:>8}: 1 request {r['single_tok_s']:.1f} tok/s, GRPO step {grpo} tok/s")
        for b, ms in r["iteration_ms"].items():
            floor = f"forward alone {results['forward_ms'][b]:6.2f} ms ({r['iteration_over_forward'][b]:.2f}x)"
            print(f"{'':>10}{b:>3} running: {ms:7.2f} ms/iteration, {floor}")
    if ratio := results.get("gleanrl_over_sglang"):
        grpo = " / ".join(f"{x:.2f}x" for x in ratio["grpo"])
        print(f"gleanrl / sglang: 1 request {ratio['single']:.2f}x, GRPO step {grpo}")
    for arm, why in results["skipped"].items():
        print(f"{arm}: skipped ({why})")
