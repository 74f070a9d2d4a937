"""`gleanrl bench e2e`: end-to-end RL, same task, seeds and steps, run side by side
(`--arms` a subset):

- `a_no_sd`: no SD: the same synchronous step, the rollout server and the update each on every core;
- `a_sglang`: as (a) with stock SGLang CPU as the rollout server (`.venv-sglang`; skipped, with the
  reason, where it is not installed). Every speedup is against the faster of (a) and this
  arm (`baseline`);
- `b_adaptive`: adaptive SD with harvest and mid-step hot-swap, from a drafter warm-started on this
  task; `c_stale`: the same start, frozen;
- `cold_adaptive` / `cold_stale`: from a randomly initialised drafter (grown during RL
  only / frozen);
- `offdomain_adaptive` / `offdomain_stale`: warm-started on another task (`running_sums`), as an
  off-the-shelf drafter would be;
- `a_no_sd_seed2`: (a) with another seed, whose distance from (a) is the run-to-run noise that the
  reward curves of (a) and (b) must agree within (SD is lossless);
- `d_stale_harvest` (not run by default): as (c), but harvesting and training without ever pushing:
  what harvesting costs the step (`harvest_cost`, d over c minus 1).

Layouts (`trainer.layout`, `--replicas`, default 0: as `gleanrl train` would): the no-SD arms on one
server over every core; the drafter arms (every one alike, so stale and adaptive differ by the
harvest alone) on one single-thread replica per core, the harvest training only on the cores of
replicas with nothing left to run, pinned there. `a_replicas`: (a) on the drafter arms' replicas,
what that layout costs without SD. With `--replicas 1` the drafter arms share one server over every
core, the harvest beside it at nice 19. The drafter's warm
start (the same-domain and off-domain arms) is the demo's (cached). The arms: `gleanrl.bench.e2e_arms`.
`--quick`: a_no_sd, a_replicas, a_sglang, b_adaptive, c_stale, cold_adaptive. Arms run ABBA
(`schedule`): the first half of every arm's steps in order, then the second half in reverse, each arm
resumed from its checkpoint. Figures: `gleanrl.bench.e2e_summary`.
`--regime` (default: the size's, `gleanrl.shipped`: self_checks on `deep`, short on `small`; the
`small` figures of docs/e2e.md used long_tail) sets the task's length distribution and the step's
shape; every run reports `rollout_share_a` (of the baseline arm). Held-out acceptance: each adaptive arm's final
serving drafter against its start on that arm's newest harvested rollouts, at the same draft length.
The server runs with `--dtype` (default auto: bfloat16 on CPUs with native bf16, where it makes SD
pay, else float32).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gleanrl import demo, demo_setup
from gleanrl.bench.e2e_arms import (
    DEFAULT_ARMS,
    OFFDOMAIN_TASK,
    QUICK_ARMS,
    RUNS,
    heldout,
    parse_arms,
    run_arm,
    schedule,
    starts,
)
from gleanrl.bench.e2e_summary import headline, summarize
from gleanrl.bench.sglang_arm import sglang_missing

QUICK_STEPS, FULL_STEPS = 12, 12


def add_arguments(p: argparse.ArgumentParser) -> None:
    demo.add_arguments(p)
    # the regime's step shape and the RL settings its figures were measured with (docs/e2e.md), not
    # the demo's RL recipe (docs/rl-gain.md): a speed benchmark, whose step shape sets the rollouts
    # it times; every arm's server and update in the fastest dtype here (auto): the fastest no-SD
    # step a user can run here is the baseline; the drafter's warm start is the demo's, so on a
    # shipped policy the drafter arms start from the shipped drafter, as the demo does
    p.set_defaults(
        out="gleanrl-bench-e2e",
        regime=None,
        steps=None,
        prompts_per_step=None,
        samples_per_prompt=None,
        lr=2e-4,
        negative_weight=0.1,
        update_dtype="auto",
    )
    p.add_argument(
        "--arms", default=None, help=f"comma-separated, of: {', '.join(RUNS)} (default: all but d_stale_harvest)"
    )
    p.add_argument(
        "--drafter",
        default=None,
        metavar="DIR",
        help="warm-start drafter of (b) and (c) (default: warm-start one on the regime's task, cached)",
    )
    p.add_argument(
        "--offdomain-drafter",
        default=None,
        metavar="DIR",
        help=f"the off-domain start (default: warm-start one on {OFFDOMAIN_TASK}, cached)",
    )
    p.add_argument(
        "--sd",
        default="adaptive",
        choices=["adaptive", "on"],
        help="the drafter arms' SD mode: adaptive (the cost model decides per "
        "iteration) or on (draft wherever a plan drafts; e.g. to see SD's cost "
        "where adaptive would not draft)",
    )
    p.add_argument("--push-every", type=int, default=10, help="adaptive arms: drafter micro-steps between pushes")
    p.add_argument("--json", default=None, help="write the summary here as JSON")
    p.add_argument(
        "--sd-speedups",
        default=None,
        metavar="R:X,...",
        help="measured SD speedup per running-count bucket (e.g. '1:2.1,2:1.7,4:1.1', "
        "from `gleanrl bench sd --batches 1,2,4`) for the modelled ceiling "
        "(default: served tokens per verify pass at <= 2 running, 1 above)",
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the rollout server runs (the trainer runs on CPU)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"arms {','.join(QUICK_ARMS)} for {QUICK_STEPS} steps (unless --arms / --steps say otherwise)",
    )


def parse_speedups(text: str | None) -> dict[str, float] | None:
    """'1:2.1,2:1.7' -> {"1": 2.1, "2": 1.7} (running-count bucket -> SD speedup)."""
    if not text:
        return None
    from gleanrl.trainer.metrics import RUNNING_BUCKETS

    out = {}
    for part in text.split(","):
        bucket, _, value = part.partition(":")
        if bucket.strip() not in {str(b) for b in RUNNING_BUCKETS} or not value:
            raise ValueError(
                f"--sd-speedups: {part!r} is not BUCKET:SPEEDUP with BUCKET one of "
                f"{', '.join(map(str, RUNNING_BUCKETS))}"
            )
        out[bucket.strip()] = float(value)
    return out


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    args.dtype, args.update_dtype = (
        demo_setup.fastest_cpu_dtype(args.dtype),
        demo_setup.fastest_cpu_dtype(args.update_dtype),
    )
    args.arms = args.arms or ",".join(QUICK_ARMS if args.quick else DEFAULT_ARMS)
    args.steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    try:
        arms = parse_arms(args.arms)
        parse_speedups(args.sd_speedups)
        if "a_sglang" in arms and (why := sglang_missing()):
            print(f"skipping arm a_sglang: {why}", file=sys.stderr)
            arms.remove("a_sglang")
        task = demo_setup.apply_regime(args)
    except ValueError as exc:
        print(f"gleanrl bench e2e: {exc}", file=sys.stderr)
        return 2
    if not demo_setup.fresh_out(out, "bench_e2e.json", args, (*RUNS, "cold_drafter0")):
        print(f"gleanrl bench e2e: {out} is not empty and not a bench output; choose another --out", file=sys.stderr)
        return 2
    try:
        policy = demo_setup.policy_of(args)
        drafters = starts(policy, args, arms)
    except ValueError as exc:
        print(f"gleanrl bench e2e: {exc}", file=sys.stderr)
        return 2
    wall: dict[str, float] = dict.fromkeys(arms, 0.0)
    harvesters: dict[str, object] = {}
    legs = schedule(arms, args.steps)
    for i, (name, upto, resume) in enumerate(legs):
        done = sum(wall.values())
        eta = f", about {done / i * (len(legs) - i) / 60:.0f} min left" if i else ""
        print(f"\n== {name} to step {upto} (leg {i + 1} of {len(legs)}, {done / 60:.1f} min so far{eta})", flush=True)
        t0 = time.monotonic()
        harvesters[name] = run_arm(name, upto, resume, policy, drafters, task, args)
        wall[name] += time.monotonic() - t0
    runs = {
        name: [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()] for name in arms
    }
    held = {
        name: heldout(h, drafters[RUNS[name][0]], policy)
        for name, h in harvesters.items()
        if h is not None and RUNS[name][1] == "push"
    }
    summary = summarize(runs, wall, parse_speedups(args.sd_speedups)) | {
        "regime": args.regime,
        "heldout_accept": held,
        "model": str(policy),
        "drafter": str(drafters["same"]) if "same" in drafters else None,
    }
    same = held.get("b_adaptive", {})
    summary |= {"heldout_accept_adaptive": same.get("serving"), "heldout_accept_stale": same.get("start")}
    print(
        "\n"
        + headline(summary)
        + "\nheld-out expected acceptance (k=4, newest policy versions), serving vs start: "
        + ", ".join(f"{k} {v['serving']:.2f} vs {v['start']:.2f}" for k, v in held.items())
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0
