"""`gleanrl bench e2e`: end-to-end RL steps, same task, seeds and steps, arms side by side (`--arms`; `e2e_arms.RUNS`):
no SD on one server, on replicas or on stock SGLang (`a_*`; the fastest is the `baseline` every speedup is against),
harvest with hot-swap (`*_adaptive`) or a frozen drafter (`*_stale`) from the demo's warm start, a random one (`cold_*`)
or one warm-started off-domain (`offdomain_*`), `a_no_sd_seed2` (seed noise: SD is lossless, so (a) and (b)'s rewards
agree within it) and, not by default, `d_stale_harvest` (what harvesting costs). Layouts as `gleanrl train`'s; arms run
ABBA (`e2e_arms.schedule`); the figures: `e2e_summary`. docs/e2e.md has the measured runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gleanrl import demo, demo_setup
from gleanrl.bench import e2e_arms
from gleanrl.bench.e2e_arms import DEFAULT_ARMS, OFFDOMAIN_TASK, QUICK_ARMS, RUNS
from gleanrl.bench.e2e_summary import headline, summarize
from gleanrl.bench.sglang_arm import sglang_missing

QUICK_STEPS, FULL_STEPS = 12, 12


def add_arguments(p: argparse.ArgumentParser) -> None:
    demo.add_arguments(p)
    # a speed benchmark: the regime's step shape and the RL settings of docs/e2e.md's figures, not the
    # demo's RL recipe; every arm in the fastest dtype here (the fastest no-SD step is the baseline)
    p.set_defaults(out="gleanrl-bench-e2e", regime=None, steps=None, prompts_per_step=None)
    p.set_defaults(samples_per_prompt=None, lr=2e-4, negative_weight=0.1, update_dtype="auto")
    add = p.add_argument
    add("--arms", help=f"comma-separated, of: {', '.join(RUNS)} (default: all but d_stale_harvest)")
    add("--drafter", metavar="DIR", help="warm-start drafter of (b) and (c) (default: the regime's task's, cached)")
    add("--offdomain-drafter", metavar="DIR", help=f"the off-domain start (default: warm-started on {OFFDOMAIN_TASK})")
    sd = "adaptive (the cost model decides per iteration) or on (draft wherever a plan drafts)"
    add("--sd", default="adaptive", choices=["adaptive", "on"], help=f"the drafter arms' SD mode: {sd}")
    add("--push-every", type=int, default=10, help="adaptive arms: drafter micro-steps between pushes")
    add("--json", help="write the summary here as JSON")
    speedups = "measured SD speedup per running-count bucket (e.g. '1:2.1,2:1.7,4:1.1', from `gleanrl bench sd "
    speedups += "--batches 1,2,4`) for the modelled ceiling (default: served tokens per verify pass at <= 2 running)"
    add("--sd-speedups", metavar="R:X,...", help=speedups)
    add("--device", choices=["cpu", "cuda"], default="cpu", help="where the rollout server runs (the trainer: on CPU)")
    quick = f"arms {','.join(QUICK_ARMS)} for {QUICK_STEPS} steps (unless --arms / --steps say otherwise)"
    add("--quick", action="store_true", help=quick)


def parse_speedups(text: str | None) -> dict[str, float] | None:
    """'1:2.1,2:1.7' -> {"1": 2.1, "2": 1.7} (running-count bucket -> SD speedup)."""
    if not text:
        return None
    from gleanrl.trainer.metrics import RUNNING_BUCKETS

    out = {}
    for part in text.split(","):
        bucket, _, value = part.partition(":")
        if bucket.strip() not in {str(b) for b in RUNNING_BUCKETS} or not value:
            buckets = ", ".join(map(str, RUNNING_BUCKETS))
            raise ValueError(f"--sd-speedups: {part!r} is not BUCKET:SPEEDUP with BUCKET one of {buckets}")
        out[bucket.strip()] = float(value)
    return out


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    args.dtype, args.update_dtype = map(demo_setup.fastest_cpu_dtype, (args.dtype, args.update_dtype))
    args.arms = args.arms or ",".join(QUICK_ARMS if args.quick else DEFAULT_ARMS)
    args.steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    try:
        arms = e2e_arms.parse_arms(args.arms)
        speedups = parse_speedups(args.sd_speedups)
        if "a_sglang" in arms and (why := sglang_missing()):
            print(f"skipping arm a_sglang: {why}", file=sys.stderr)
            arms.remove("a_sglang")
        task = demo_setup.apply_regime(args)
        if not demo_setup.fresh_out(out, "bench_e2e.json", args, (*RUNS, "cold_drafter0")):
            raise ValueError(f"{out} is not empty and not a bench output; choose another --out")
        policy = demo_setup.policy_of(args)
        drafters = e2e_arms.starts(policy, args, arms)
    except ValueError as exc:
        print(f"gleanrl bench e2e: {exc}", file=sys.stderr)
        return 2
    wall: dict[str, float] = dict.fromkeys(arms, 0.0)
    harvesters: dict[str, object] = {}
    legs = e2e_arms.schedule(arms, args.steps)
    for i, (name, upto, resume) in enumerate(legs):
        done = sum(wall.values())
        eta = f", about {done / i * (len(legs) - i) / 60:.0f} min left" if i else ""
        print(f"\n== {name} to step {upto} (leg {i + 1} of {len(legs)}, {done / 60:.1f} min so far{eta})", flush=True)
        t0 = time.monotonic()
        harvesters[name] = e2e_arms.run_arm(name, upto, resume, policy, drafters, task, args)
        wall[name] += time.monotonic() - t0
    runs = {name: [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()] for name in arms}
    pushing = [name for name, h in harvesters.items() if h is not None and RUNS[name][1] == "push"]
    held = {name: e2e_arms.heldout(harvesters[name], drafters[RUNS[name][0]], policy) for name in pushing}
    drafter = str(drafters["same"]) if "same" in drafters else None
    summary = summarize(runs, wall, speedups) | {"regime": args.regime, "heldout_accept": held}
    summary |= {"model": str(policy), "drafter": drafter}
    same = held.get("b_adaptive", {})
    summary |= {"heldout_accept_adaptive": same.get("serving"), "heldout_accept_stale": same.get("start")}
    vs = ", ".join(f"{k} {v['serving']:.2f} vs {v['start']:.2f}" for k, v in held.items())
    print(f"\n{headline(summary)}\nheld-out expected acceptance (k=4, newest policy versions), serving vs start: {vs}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0
