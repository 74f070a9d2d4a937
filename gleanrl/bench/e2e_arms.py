"""bench e2e's arms (`RUNS`: each one's drafter start, harvest and seed), the drafters they start
from, the ABBA order they run in, and one leg of an arm on servers of its own (`run_arm`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gleanrl import demo_rl, demo_setup

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


def sglang_args(args: argparse.Namespace) -> dict:
    """Stock SGLang with a KV pool for every rollout of a step at its longest."""
    tokens = args.prompts_per_step * args.samples_per_prompt * (args.max_new_tokens + 512)
    return {"backend": "sglang", "sglang_arg": [f"--max-total-tokens={tokens}"]}


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
    sglang = name == "a_sglang"
    layout = {"replicas": 1 if sglang else args.replicas, "backend": sglang_args(args) if sglang else None}
    layout |= {"harvests": start is not None or name == "a_replicas", "sd": args.sd, "device": args.device}
    with demo_rl.serving(policy, drafter0, out / f"{name}.server.log", dtype=args.dtype, **layout) as servers:
        hooks, h = NoHooks(), None
        if harvest:
            push = args.push_every if harvest == "push" else 0
            nice = 19 if len(servers.servers) == 1 else 0
            cfg = HarvestConfig(push_every=push, max_holdout=16, seed=args.seed, idle_nice=nice)
            h = Harvester(policy, drafter0, out / name / "harvest" / "spool", push=None, cfg=cfg)
            hooks = demo_rl.demo_hooks(h)
        cfg = demo_rl.rl_config(policy, out / name, args, args.seed + seed_offset)
        cfg.steps = upto
        log = demo_rl.table_logger(out / name / "metrics.jsonl")
        train(cfg, task=task, hooks=hooks, log=log, resume=resume, replicas=servers)
    return h
