"""`gleanrl bench e2e`: end-to-end RL steps, same task, seeds and steps, arms side by side (`--arms`; `RUNS`): no SD
on one server, on replicas or on stock SGLang (`a_*`; the fastest is the `baseline` every speedup is against), harvest
with hot-swap (`*_adaptive`) or a frozen drafter (`*_stale`) from the demo's warm start, a random one (`cold_*`) or one
warm-started off-domain (`offdomain_*`), `a_no_sd_seed2` (seed noise: SD is lossless, so (a) and (b)'s rewards agree
within it) and, not by default, `d_stale_harvest` (what harvesting costs). Layouts as `gleanrl train`'s; each arm runs
its legs (`run_arm`) on servers of its own, ABBA (`schedule`); the figures: `e2e_summary`. docs/e2e.md has the runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gleanrl import demo, demo_setup
from gleanrl.bench.e2e_summary import headline, summarize
from gleanrl.bench.serve_process import sglang_missing, write_json

QUICK_STEPS, FULL_STEPS = 12, 12
# name -> (the drafter's start: None (no SD) | "same" | "cold" | "offdomain", harvest, seed offset)
RUNS = {
    "a_no_sd": (None, None, 0),
    "a_sglang": (None, None, 0),
    "a_replicas": (None, None, 0),
    "b_adaptive": ("same", "push", 0),
    "c_stale": ("same", None, 0),
    "cold_adaptive": ("cold", "push", 0),
    "cold_stale": ("cold", None, 0),
    "offdomain_adaptive": ("offdomain", "push", 0),
    "offdomain_stale": ("offdomain", None, 0),
    "a_no_sd_seed2": (None, None, 1),
    "d_stale_harvest": ("same", "train", 0),
}
DEFAULT_ARMS = [name for name in RUNS if name != "d_stale_harvest"]
QUICK_ARMS = ["a_no_sd", "a_replicas", "a_sglang", "b_adaptive", "c_stale", "cold_adaptive"]
OFFDOMAIN_TASK = "running_sums"


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in RUNS]
    if unknown or not arms:
        raise ValueError(f"unknown arm(s) {', '.join(unknown) or '(none given)'}: choose from {', '.join(RUNS)}")
    return [name for name in RUNS if name in arms]  # the fixed order: a first, then each start


def starts(policy: Path, args: argparse.Namespace, arms: list[str]) -> dict[str, Path]:
    """The drafter starts the chosen arms need (warm starts are cached; the cold one is written here)."""
    from gleanrl.harvest.checkpoint import save_drafter
    from gleanrl.harvest.cli_init import init_drafter

    needed = {RUNS[name][0] for name in arms} - {None}
    out: dict[str, Path] = {}
    if "same" in needed:
        out["same"] = Path(args.drafter) if args.drafter else demo_setup.warm_drafter(policy, args)
    if "offdomain" in needed:
        given = args.offdomain_drafter
        out["offdomain"] = Path(given) if given else demo_setup.warm_drafter(policy, args, task=OFFDOMAIN_TASK)
    if "cold" in needed:
        out["cold"] = save_drafter(init_drafter(policy, seed=args.seed), Path(args.out) / "cold_drafter0")
    for name, path in out.items():
        if not (path / "config.json").is_file():
            raise ValueError(f"the {name} drafter {path} is not a drafter directory (no config.json)")
    return out


def heldout(h, start: Path, policy: Path) -> dict:
    """The arm's final serving drafter and its start on its newest held-out rollouts (same draft length)."""
    from gleanrl.harvest.checkpoint import load_drafter

    return {"serving": h.score(h.serving) or 0.0, "start": h.score(load_drafter(start, target_config=policy)) or 0.0}


def schedule(arms: list[str], steps: int) -> list[tuple[str, int, bool]]:
    """ABBA: every arm's first half of the steps in order, then the second half in reverse (resumed), so
    a drift of the machine's speed hits every arm alike. -> (arm, last step of the leg, resume)."""
    half = steps // 2
    if half < 1:
        return [(name, steps, False) for name in arms]
    return [(name, half, False) for name in arms] + [(name, steps, True) for name in reversed(arms)]


def run_arm(
    name: str, upto: int, resume: bool, policy: Path, drafters: dict[str, Path], task, args: argparse.Namespace
):
    """One leg of arm `name`: its steps up to `upto` (resumed), on servers of its own; its Harvester, if any."""
    from gleanrl.harvest.config import HarvestConfig
    from gleanrl.harvest.harvester import Harvester
    from gleanrl.trainer.hooks import NoHooks
    from gleanrl.trainer.loop import train

    out = Path(args.out)
    start, harvest, seed_offset = RUNS[name]
    drafter0 = drafters.get(start)
    sglang = name == "a_sglang"  # stock SGLang, with a KV pool for every rollout of a step at its longest
    tokens = args.prompts_per_step * args.samples_per_prompt * (args.max_new_tokens + 512)
    backend = {"backend": "sglang", "sglang_arg": [f"--max-total-tokens={tokens}"]} if sglang else None
    layout = {"replicas": 1 if sglang else args.replicas, "backend": backend}
    layout |= {"harvests": start is not None or name == "a_replicas", "sd": args.sd, "device": args.device}
    with demo_setup.serving(policy, drafter0, out / f"{name}.server.log", dtype=args.dtype, **layout) as servers:
        hooks, h = NoHooks(), None
        if harvest:
            push = args.push_every if harvest == "push" else 0
            nice = 19 if len(servers.servers) == 1 else 0
            cfg = HarvestConfig(push_every=push, max_holdout=16, seed=args.seed, idle_nice=nice)
            h = Harvester(policy, drafter0, out / name / "harvest" / "spool", push=None, cfg=cfg)
            hooks = demo_setup.demo_hooks(h)
        cfg = demo_setup.rl_config(policy, out / name, args, args.seed + seed_offset)
        cfg.steps = upto
        log = demo_setup.table_logger(out / name / "metrics.jsonl")
        train(cfg, task=task, hooks=hooks, log=log, resume=resume, replicas=servers)
    return h


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
        arms = parse_arms(args.arms)
        speedups = parse_speedups(args.sd_speedups)
        if "a_sglang" in arms and (why := sglang_missing()):
            print(f"skipping arm a_sglang: {why}", file=sys.stderr)
            arms.remove("a_sglang")
        task = demo_setup.apply_regime(args)
        if not demo_setup.fresh_out(out, "bench_e2e.json", args, (*RUNS, "cold_drafter0")):
            raise ValueError(f"{out} is not empty and not a bench output; choose another --out")
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
    runs = {name: [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()] for name in arms}
    pushing = [name for name, h in harvesters.items() if h is not None and RUNS[name][1] == "push"]
    held = {name: heldout(harvesters[name], drafters[RUNS[name][0]], policy) for name in pushing}
    drafter = str(drafters["same"]) if "same" in drafters else None
    summary = summarize(runs, wall, speedups) | {"regime": args.regime, "heldout_accept": held}
    summary |= {"model": str(policy), "drafter": drafter}
    same = held.get("b_adaptive", {})
    summary |= {"heldout_accept_adaptive": same.get("serving"), "heldout_accept_stale": same.get("start")}
    vs = ", ".join(f"{k} {v['serving']:.2f} vs {v['start']:.2f}" for k, v in held.items())
    print(f"\n{headline(summary)}\nheld-out expected acceptance (k=4, newest policy versions), serving vs start: {vs}")
    write_json(args.json, summary, indent=1)
    return 0
