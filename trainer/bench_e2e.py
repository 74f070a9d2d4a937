"""`gleanrl bench e2e`: end-to-end RL, same task, seeds and steps, run side by side:
(a) no SD; (b) adaptive SD with harvest and mid-step hot-swap; (c) adaptive SD with the warm-start
drafter frozen (stale); and (a) again with another seed, whose distance from (a) is the run-to-run
noise that the reward curves of (a) and (b) must agree within (SD is lossless).

Step time is rollout + policy update + weight push (what the trainer waits for); the drafter's
overhead is the time the last micro-step ran past each idle window's close, over step time.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainer import demo

RUNS = {  # name -> (SD with a drafter, harvest, seed offset)
    "a_no_sd": (False, False, 0),
    "b_adaptive": (True, True, 0),
    "c_stale": (True, False, 0),
    "a_no_sd_seed2": (False, False, 1),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    demo.add_arguments(p)
    p.set_defaults(out="gleanrl-bench-e2e")
    p.add_argument("--json", default=None, help="write the summary here as JSON")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def step_times(rows: list[dict]) -> list[float]:
    return [r["rollout_s"] + r["train_s"] + r["push_s"] for r in rows]


def summarize(runs: dict[str, list[dict]]) -> dict:
    a, b, c, a2 = (runs[k] for k in RUNS)
    col = lambda rows, key: [float(r.get(key) or 0.0) for r in rows]  # noqa: E731
    ta, tb = step_times(a), step_times(b)
    return {
        "steps": len(b),
        "speedup_e2e": sum(ta) / sum(tb) if sum(tb) > 0 else 0.0,
        "step_time_a": ta, "step_time_b": tb, "step_time_c": step_times(c),
        "accept_len_adaptive": _mean(col(b, "spec_accept_length")),
        "accept_len_stale": _mean(col(c, "spec_accept_length")),
        "accept_len_adaptive_per_step": col(b, "spec_accept_length"),
        "accept_len_stale_per_step": col(c, "spec_accept_length"),
        "drafter_overhead": sum(col(b, "idle_overrun_s")) / sum(tb) if sum(tb) > 0 else 0.0,
        "idle_used_s": sum(col(b, "idle_used_s")), "drafter_version": int(b[-1].get("drafter_version", 0)) if b else 0,
        "reward_a": col(a, "reward_mean"), "reward_b": col(b, "reward_mean"), "reward_a_seed2": col(a2, "reward_mean"),
        "accuracy_a": col(a, "accuracy"), "accuracy_b": col(b, "accuracy"),
        "reward_gap_ab": _mean([abs(x - y) for x, y in zip(col(a, "reward_mean"), col(b, "reward_mean"))]),
        "reward_noise_seed": _mean([abs(x - y) for x, y in zip(col(a, "reward_mean"), col(a2, "reward_mean"))]),
    }


def run(args: argparse.Namespace) -> int:
    from harvest.harvester import HarvestConfig, Harvester
    from trainer.bootstrap import bootstrap_policy
    from trainer.generate import NoHooks
    from trainer.loop import train
    from trainer.tasks import load_task

    out = Path(args.out)
    if not demo.fresh_out(out, "bench_e2e.json", args, tuple(RUNS)):
        print(f"gleanrl bench e2e: {out} is not empty and not a bench output; choose another --out", file=sys.stderr)
        return 2
    policy = Path(args.model) if args.model else bootstrap_policy(size=args.size, seed=args.seed)
    drafter0 = demo.warm_drafter(policy, args)
    runs: dict[str, list[dict]] = {}
    for name, (sd, harvest, seed_offset) in RUNS.items():
        print(f"\n== {name}", flush=True)
        with demo.serving(policy, drafter0 if sd else None, out / f"{name}.server.log") as server:
            hooks = NoHooks()
            if harvest:
                hooks = demo.demo_hooks(Harvester(policy, drafter0, out / name / "harvest" / "spool", push=None,
                                                  cfg=HarvestConfig(push_every=10, max_holdout=16, seed=args.seed)))
            cfg = demo.rl_config(policy, out / name, server.url, args, args.seed + seed_offset)
            train(cfg, task=load_task(None), hooks=hooks, log=demo.table_logger(out / name / "metrics.jsonl"))
        runs[name] = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    summary = summarize(runs)
    print(f"\nsteps {summary['steps']}: total step time no SD {sum(summary['step_time_a']):.1f} s, adaptive "
          f"{sum(summary['step_time_b']):.1f} s -> speedup {summary['speedup_e2e']:.2f}x; acceptance adaptive "
          f"{summary['accept_len_adaptive']:.2f} vs stale {summary['accept_len_stale']:.2f}; drafter overhead "
          f"{summary['drafter_overhead']:.1%}; reward gap a/b {summary['reward_gap_ab']:.3f} "
          f"(seed noise {summary['reward_noise_seed']:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0
