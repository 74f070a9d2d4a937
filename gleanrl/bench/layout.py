"""`gleanrl bench layout`: plain decoding per running count at 1 and N threads, and a GRPO step's rollouts
per layout of the rollout servers on the cores (`single`: one over every core; `single_t1`: one thread on
one core; `replicas`: one single-thread server per core, `gleanrl train`'s default on CPU). All servers
stay up through `--rounds` rounds timing every arm in a rotating order; reported: `t1_over_t2[B]` and each
layout's `grpo_speedup` over `single`, as [min, median, max] over rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from gleanrl.bench.engine import add_shared, grpo_step, iteration_ms, task_prompts
from gleanrl.bench.serve_process import write_json

BUCKETS = (1, 2, 4, 8, 16, 32)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add_shared(add, BUCKETS, bucket_tokens=48)
    regime = "the task's length distribution (trainer.tasks.presets; default: the built-in task's)"
    add("--regime", default=None, help=regime)
    add("--rounds", type=int, default=3, help="interleaved rounds")


def grpo_seconds(urls: list[str], prompts: list[list[int]], args: argparse.Namespace, rnd: int) -> float:
    """One step's rollouts; with several servers a prompt's samples go to one (dealt in turn)."""
    return round(grpo_step(lambda i: urls[(i // args.n) % len(urls)], prompts, args, rnd)[0], 3)


def _servers(model: str, dtype: str, log_dir: Path) -> dict:
    from gleanrl.trainer.layout import Replicas, core_groups
    from gleanrl.trainer.phases import all_cores

    cores = sorted(all_cores())
    settings = {"sd": "off", "dtype": dtype, "log_level": "warning"}  # serve's defaults otherwise
    groups = {"single": [set(cores)], "single_t1": [{cores[0]}], "replicas": core_groups(cores, len(cores))}
    return {name: Replicas(model, g, settings, log_path=log_dir / f"{name}.log") for name, g in groups.items()}


def run(args: argparse.Namespace) -> int:
    from gleanrl.demo_setup import fastest_cpu_dtype, wait_healthy
    from gleanrl.shipped import policy_or_shipped
    from gleanrl.trainer.tasks.presets import regime

    args.dtype = fastest_cpu_dtype(args.dtype)
    try:
        model = policy_or_shipped(args.model)
        buckets = [int(b) for b in args.buckets.split(",") if b]
        task_spec = regime(args.regime).task if args.regime else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prompts = task_prompts(model, task_spec, max(args.prompts, 8), args.seed)
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
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                for b in iters.get(name, ()):
                    iters[name][b].append(iteration_ms(servers[name].urls[0], prompts, b, args.bucket_tokens, 3))
                grpo[name].append(grpo_seconds(servers[name].urls, prompts, args, rnd + 1))
                print(f"round {rnd + 1}/{args.rounds} {name}: GRPO step {grpo[name][-1]:.2f} s", file=sys.stderr)
    finally:
        for s in servers.values():
            s.stop()
    step = f"{args.prompts} x {args.n}, <= {args.max_new_tokens} tokens, regime {args.regime or 'default'}"
    results = summarize(iters, grpo) | {"model": model, "dtype": args.dtype, "cores": len(os.sched_getaffinity(0))}
    results |= {"rounds": args.rounds, "step": step}
    _print(results)
    write_json(args.json, results)
    return 0


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def summarize(iters: dict[str, dict[int, list[float]]], grpo: dict[str, list[float]]) -> dict:
    """Ratios per round (rounds pair the arms), each as [min, median, max]."""

    def spread(xs: list[float]) -> list[float]:
        return [round(min(xs), 3), round(_median(xs), 3), round(max(xs), 3)]

    # a bucket whose 1-thread iteration timed 0 in every round (clamped noise on a tiny model) has no ratio
    ratios = {
        b: [t2 / t1 for t1, t2 in zip(iters["single_t1"][b], iters["single"][b]) if t1 > 0] for b in iters["single"]
    }
    t1_over_t2 = {b: spread(xs) for b, xs in ratios.items() if xs}
    speedup = {n: spread([s / x for s, x in zip(grpo["single"], xs)]) for n, xs in grpo.items() if n != "single"}
    return {
        "iteration_ms": iters,
        "grpo_s": grpo,
        "t1_over_t2": t1_over_t2,
        "grpo_speedup": speedup,
        "best_layout": min(grpo, key=lambda n: _median(grpo[n])),
    }


def _print(r: dict) -> None:
    print("plain decode, ms per iteration (median over rounds) and 1 thread over 2 (speed):")
    for b, (lo, mid, hi) in r["t1_over_t2"].items():
        t1, t2 = (_median(r["iteration_ms"][n][b]) for n in ("single_t1", "single"))
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
