"""`gleanrl bench e2e`: end-to-end RL, same task, seeds and steps, run side by side:
(a) no SD; (b) adaptive SD with harvest and mid-step hot-swap; (c) adaptive SD with the warm-start
drafter frozen (stale); (d) as (c), but the harvester captures and trains in the idle windows without
ever pushing: what harvesting costs the step; and (a) again with another seed, whose distance from (a)
is the run-to-run noise that the reward curves of (a) and (b) must agree within (SD is lossless).

Step time is rollout + policy update + weight push (what the trainer waits for). The drafter's cost is
measured twice: `drafter_overhead`, the time the last micro-step ran past each idle window's close over
(b)'s step time (what the policy update waited for), and `harvest_cost`, (d)'s step time over (c)'s
minus 1, which also counts rollouts slowed by drafter training on cores the server shares hardware
with (memory bandwidth, caches: measured on a 2-vCPU machine). Acceptance
is the server's (`spec_accept_length` of the step's rollouts); `accept_ratio_late` compares (b) and (c)
over the second half of the steps, once the policy has drifted from what the warm start was trained on.
The server runs with `--dtype` (default bfloat16, which makes SD pay on CPUs with AVX-512 BF16).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gleanrl import demo

RUNS = {  # name -> (SD with a drafter, harvest: None | "push" | "train", seed offset)
    "a_no_sd": (False, None, 0),
    "b_adaptive": (True, "push", 0),
    "c_stale": (True, None, 0),
    "d_stale_harvest": (True, "train", 0),
    "a_no_sd_seed2": (False, None, 1),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    demo.add_arguments(p)
    p.set_defaults(out="gleanrl-bench-e2e")
    p.add_argument("--drafter", default=None, metavar="DIR",
                   help="warm-start drafter of (b) and (c) (default: warm-start one, cached)")
    p.add_argument("--push-every", type=int, default=10, help="(b): drafter micro-steps between push attempts")
    p.add_argument("--json", default=None, help="write the summary here as JSON")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the rollout server runs (the trainer runs on CPU)")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def step_times(rows: list[dict]) -> list[float]:
    return [r["rollout_s"] + r["train_s"] + r["push_s"] for r in rows]


def _ratio(x: float, y: float) -> float:
    return x / y if y > 0 else 0.0


def summarize(runs: dict[str, list[dict]]) -> dict:
    a, b, c, a2 = runs["a_no_sd"], runs["b_adaptive"], runs["c_stale"], runs["a_no_sd_seed2"]
    d = runs.get("d_stale_harvest", [])
    col = lambda rows, key: [float(r.get(key) or 0.0) for r in rows]  # noqa: E731
    ta, tb = step_times(a), step_times(b)
    late = len(b) // 2  # the second half of the steps
    accept_b, accept_c = col(b, "spec_accept_length"), col(c, "spec_accept_length")
    return {
        "steps": len(b),
        "speedup_e2e": sum(ta) / sum(tb) if sum(tb) > 0 else 0.0,
        "step_time_a": ta, "step_time_b": tb, "step_time_c": step_times(c),
        "accept_len_adaptive": _mean(col(b, "spec_accept_length")),
        "accept_len_stale": _mean(col(c, "spec_accept_length")),
        "accept_len_adaptive_per_step": accept_b, "accept_len_stale_per_step": accept_c,
        "accept_ratio": _ratio(_mean(accept_b), _mean(accept_c)),
        "accept_ratio_late": _ratio(_mean(accept_b[late:]), _mean(accept_c[late:])),
        "speedup_stale": _ratio(sum(ta), sum(step_times(c))),
        "harvest_cost": _ratio(sum(step_times(d)), sum(step_times(c))) - 1 if d else None,
        "rollout_time_c": col(c, "rollout_s"), "rollout_time_d": col(d, "rollout_s"),
        "drafter_overhead": _ratio(sum(col(b, "idle_overrun_s")), sum(tb)),
        "idle_window_s": sum(col(b, "idle_window_s")), "idle_used_s": sum(col(b, "idle_used_s")),
        "idle_capture_s": sum(col(b, "idle_capture_s")), "idle_train_s": sum(col(b, "idle_train_s")),
        "drafter_steps": int(sum(col(b, "drafter_steps"))),
        "drafter_version": int(b[-1].get("drafter_version", 0)) if b else 0,
        "reward_a": col(a, "reward_mean"), "reward_b": col(b, "reward_mean"), "reward_a_seed2": col(a2, "reward_mean"),
        "accuracy_a": col(a, "accuracy"), "accuracy_b": col(b, "accuracy"),
        "reward_gap_ab": _mean([abs(x - y) for x, y in zip(col(a, "reward_mean"), col(b, "reward_mean"))]),
        "reward_noise_seed": _mean([abs(x - y) for x, y in zip(col(a, "reward_mean"), col(a2, "reward_mean"))]),
    }


def heldout(h, drafter0: Path, policy: Path) -> dict:
    """(b)'s final serving drafter and the warm start on (b)'s newest held-out rollouts, at the same draft
    length: acceptance free of the server's choice of draft length."""
    from gleanrl.harvest.checkpoint import load_drafter
    adaptive, stale = h.score(h.serving), h.score(load_drafter(drafter0, target_config=policy))
    return {"heldout_accept_adaptive": adaptive or 0.0, "heldout_accept_stale": stale or 0.0}


def run(args: argparse.Namespace) -> int:
    from gleanrl.harvest.harvester import HarvestConfig, Harvester
    from gleanrl.trainer.bootstrap import bootstrap_policy
    from gleanrl.trainer.generate import NoHooks
    from gleanrl.trainer.loop import train
    from gleanrl.trainer.tasks import load_task

    out = Path(args.out)
    if not demo.fresh_out(out, "bench_e2e.json", args, tuple(RUNS)):
        print(f"gleanrl bench e2e: {out} is not empty and not a bench output; choose another --out", file=sys.stderr)
        return 2
    policy = Path(args.model) if args.model else bootstrap_policy(size=args.size, seed=args.seed)
    drafter0 = Path(args.drafter) if args.drafter else demo.warm_drafter(policy, args)
    if not (drafter0 / "config.json").is_file():
        print(f"gleanrl bench e2e: {drafter0} is not a drafter directory (no config.json)", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {}
    harvesters = {}
    for name, (sd, harvest, seed_offset) in RUNS.items():
        print(f"\n== {name}", flush=True)
        with demo.serving(policy, drafter0 if sd else None, out / f"{name}.server.log", dtype=args.dtype,
                          device=args.device) as server:
            hooks = NoHooks()
            if harvest:
                push_every = args.push_every if harvest == "push" else 0
                harvesters[name] = Harvester(policy, drafter0, out / name / "harvest" / "spool", push=None,
                                             cfg=HarvestConfig(push_every=push_every, max_holdout=16, seed=args.seed))
                hooks = demo.demo_hooks(harvesters[name])
            cfg = demo.rl_config(policy, out / name, server.url, args, args.seed + seed_offset)
            train(cfg, task=load_task(None), hooks=hooks, log=demo.table_logger(out / name / "metrics.jsonl"))
        runs[name] = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    summary = summarize(runs) | heldout(harvesters["b_adaptive"], drafter0, policy)
    s = summary
    print(f"\nsteps {s['steps']}: total step time no SD {sum(s['step_time_a']):.1f} s, adaptive "
          f"{sum(s['step_time_b']):.1f} s, stale {sum(s['step_time_c']):.1f} s -> speedup {s['speedup_e2e']:.2f}x "
          f"(goal >= 1.7x; stale {s['speedup_stale']:.2f}x)\nacceptance adaptive {s['accept_len_adaptive']:.2f} vs "
          f"stale {s['accept_len_stale']:.2f} = {s['accept_ratio']:.2f}x, second half {s['accept_ratio_late']:.2f}x "
          f"(goal >= 1.4x); drafter versions pushed {s['drafter_version']}, {s['drafter_steps']} micro-steps\n"
          f"idle window {s['idle_window_s']:.1f} s: capture {s['idle_capture_s']:.1f} s, drafter training "
          f"{s['idle_train_s']:.1f} s; drafter overhead {s['drafter_overhead']:.1%} of step time (goal <= 3%); "
          f"harvest cost (d)/(c) {s['harvest_cost']:+.1%}\n"
          f"held-out expected acceptance (k=4, newest policy versions): adaptive {s['heldout_accept_adaptive']:.2f} "
          f"vs warm start {s['heldout_accept_stale']:.2f}\n"
          f"reward gap a/b {s['reward_gap_ab']:.3f} (seed noise {s['reward_noise_seed']:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0
