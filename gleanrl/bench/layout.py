"""`gleanrl bench layout`: plain decoding per running count at each thread count, and a GRPO step's
rollouts in each layout of the rollout servers on this machine's cores, arms interleaved.

Layouts (`trainer.layout`, every server `gleanrl serve --sd off` on the same policy and dtype):
- `single`: one server over every core, one torch thread per core (the layout before replicas);
- `single_t1`: one server with one thread, pinned to one core;
- `replicas`: one single-thread server per core, each pinned to its core, a prompt's samples on one
  of them (`trainer.generate.spread`): `gleanrl train`'s default on CPU.
All servers start first and stay up; then `--rounds` rounds, each timing every arm in turn (the order
rotating), so drift hits all alike:
- `iteration_ms[B]` (the two single servers): the wall time per decode iteration with B requests
  running, (T(L) - T(1)) / (L - 1) for requests of L tokens (ignore_eos), so prefill and HTTP cancel;
- `grpo_s` (every layout): P prompts x n samples of the built-in task at T = 1 (seeded, natural EOS),
  all sent at once as the trainer does, the wall time until the last finishes.
Reported: each figure's per-round values, `t1_over_t2[B]` (decode speed at one thread over two,
per running count: > 1 where one thread is faster) and `grpo_speedup` of each layout over `single`
with its min-max over rounds. Read the ratios, on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BUCKETS = (1, 2, 4, 8, 16, 32)
LAYOUTS = ("single", "single_t1", "replicas")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="policy directory (default: the shipped demo policy, gleanrl.shipped)"
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="auto: bfloat16 on CPUs with native bf16, else float32",
    )
    parser.add_argument("--buckets", default=",".join(map(str, BUCKETS)), help="running requests per iteration bucket")
    parser.add_argument("--bucket-tokens", type=int, default=48, help="L: output tokens per bucket request")
    parser.add_argument("--prompts", type=int, default=8, help="GRPO step: prompts")
    parser.add_argument("--n", type=int, default=8, help="GRPO step: samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="GRPO step: the longest response")
    parser.add_argument(
        "--regime",
        default=None,
        help="the task's length distribution (trainer.tasks.presets; default: the built-in task's)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--json", default=None, help="write the results here")


def _post_all(url_of, ids: list[list[int]], params: list[dict]) -> float:
    """Send every request at once (request i to `url_of(i)`); the wall seconds until the last ends."""
    import httpx

    async def main() -> float:
        limits = httpx.Limits(max_connections=len(ids) + 4)
        async with httpx.AsyncClient(timeout=1800, limits=limits) as client:

            async def one(i: int) -> None:
                body = {"input_ids": ids[i], "sampling_params": params[i]}
                (await client.post(f"{url_of(i)}/generate", json=body)).raise_for_status()

            start = time.perf_counter()
            await asyncio.gather(*[one(i) for i in range(len(ids))])
            return time.perf_counter() - start

    return asyncio.run(main())


def iteration_ms(url: str, prompts: list[list[int]], b: int, tokens: int) -> float:
    ids = [prompts[i % len(prompts)] for i in range(b)]
    fixed = lambda n: [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}] * b  # noqa: E731
    t1, tl = (min(_post_all(lambda i: url, ids, fixed(n)) for _ in range(2)) for n in (1, tokens))
    return round(max(tl - t1, 0.0) / (tokens - 1) * 1e3, 3)


def grpo_seconds(urls: list[str], prompts: list[list[int]], args: argparse.Namespace, rnd: int) -> float:
    """One step's rollouts; with several servers a prompt's samples go to one (dealt in turn)."""
    ids = [p for p in prompts[: args.prompts] for _ in range(args.n)]
    params = [
        {"max_new_tokens": args.max_new_tokens, "temperature": 1.0, "sampling_seed": 10_007 * rnd + i}
        for i in range(len(ids))
    ]
    return round(_post_all(lambda i: urls[(i // args.n) % len(urls)], ids, params), 3)


def _servers(model: str, dtype: str, log_dir: Path) -> dict:
    from gleanrl.trainer.layout import Replicas, core_groups
    from gleanrl.trainer.phases import all_cores

    cores = sorted(all_cores())
    settings = {"sd": "off", "dtype": dtype, "log_level": "warning"}  # serve's defaults otherwise
    groups = {"single": [set(cores)], "single_t1": [{cores[0]}], "replicas": core_groups(cores, len(cores))}
    return {name: Replicas(model, g, settings, log_path=log_dir / f"{name}.log") for name, g in groups.items()}


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from gleanrl.demo_rl import wait_healthy
    from gleanrl.demo_setup import fastest_cpu_dtype
    from gleanrl.trainer.generate import encode_prompt
    from gleanrl.trainer.tasks import load_task

    args.dtype = fastest_cpu_dtype(args.dtype)
    from gleanrl.shipped import policy_or_shipped

    try:
        model = policy_or_shipped(args.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        buckets = [int(b) for b in args.buckets.split(",") if b]
        task_spec = None
        if args.regime:
            from gleanrl.trainer.tasks.presets import regime

            task_spec = regime(args.regime).task
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [encode_prompt(tok, s) for s in load_task(task_spec).prompts("train", max(args.prompts, 8), args.seed)]
    log_dir = Path(tempfile.mkdtemp(prefix="gleanrl-bench-layout-"))
    servers = _servers(model, args.dtype, log_dir)
    print(f"starting {sum(len(s.servers) for s in servers.values())} servers (logs {log_dir})", file=sys.stderr)
    iters = {name: {b: [] for b in buckets} for name in ("single", "single_t1")}
    grpo = {name: [] for name in servers}
    try:
        for s in servers.values():
            s.start()
        for s in servers.values():
            for one in s.servers:
                wait_healthy(one)
        warm = argparse.Namespace(**{**vars(args), "max_new_tokens": 16})
        for s in servers.values():  # warm-up: first forwards, allocator, compiled kernels
            grpo_seconds(s.urls, prompts, warm, 0)
        names = list(servers)
        for rnd in range(args.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in order:
                if name in iters:
                    for b in buckets:
                        iters[name][b].append(iteration_ms(servers[name].urls[0], prompts, b, args.bucket_tokens))
                grpo[name].append(grpo_seconds(servers[name].urls, prompts, args, rnd + 1))
                print(
                    f"round {rnd + 1}/{args.rounds} {name}: GRPO step {grpo[name][-1]:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for s in servers.values():
            s.stop()
    results = summarize(iters, grpo) | {
        "model": model,
        "dtype": args.dtype,
        "cores": len(os.sched_getaffinity(0)),
        "rounds": args.rounds,
        "step": f"{args.prompts} x {args.n}, <= {args.max_new_tokens} tokens, regime {args.regime or 'default'}",
    }
    _print(results)
    if args.json:
        from gleanrl.base.atomic import atomic_file

        with atomic_file(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def summarize(iters: dict[str, dict[int, list[float]]], grpo: dict[str, list[float]]) -> dict:
    """Ratios per round (rounds pair the arms), each as [min, median, max]."""

    def spread(xs: list[float]) -> list[float]:
        xs = sorted(xs)
        return [round(xs[0], 3), round(xs[len(xs) // 2], 3), round(xs[-1], 3)]

    t1_over_t2 = {
        b: spread([t2 / t1 for t1, t2 in zip(iters["single_t1"][b], iters["single"][b]) if t1 > 0])
        for b in iters["single"]
    }
    speedup = {
        name: spread([s / x for s, x in zip(grpo["single"], xs)]) for name, xs in grpo.items() if name != "single"
    }
    return {
        "iteration_ms": iters,
        "grpo_s": grpo,
        "t1_over_t2": t1_over_t2,
        "grpo_speedup": speedup,
        "best_layout": min(grpo, key=lambda n: sorted(grpo[n])[len(grpo[n]) // 2]),
    }


def _print(r: dict) -> None:
    print("plain decode, ms per iteration (median over rounds) and 1 thread over 2 (speed):")
    for b, (lo, mid, hi) in r["t1_over_t2"].items():
        t1, t2 = (sorted(r["iteration_ms"][n][b])[len(r["iteration_ms"][n][b]) // 2] for n in ("single_t1", "single"))
        print(
            f"  {b:>3} running: 1 thread {t1:7.2f} ms, {r['cores']} threads {t2:7.2f} ms -> "
            f"{mid:.2f}x ({lo:.2f}-{hi:.2f})"
        )
    print(f"GRPO step ({r['step']}), wall s per round:")
    for name, xs in r["grpo_s"].items():
        ratio = r["grpo_speedup"].get(name)
        extra = f"  {ratio[1]:.2f}x single ({ratio[0]:.2f}-{ratio[2]:.2f})" if ratio else ""
        print(f"  {name:>9}: {' / '.join(f'{x:.2f}' for x in xs)}{extra}")
    print(f"fastest layout: {r['best_layout']}")
