"""`gleanrl bench rollout`: GRPO steps' rollouts as the trainer sends them (P prompts x n samples at
once, T = 1, `--steps` over the same prompts), in SD arms side by side: each an in-process engine with
the arm's `gleanrl serve` flags (SERVE; `serve_flags` in the JSON), and `sglang`, stock SGLang CPU over
HTTP (skipped with the reason where `.venv-sglang` is missing). accept_length: tokens per verify pass
(bonus included, as SGLang's); tokens_per_pass: tokens a decoding sequence gets per target pass. A
greedy step per arm checks SD is lossless (`identical_greedy`). Read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ARMS = ("plain", "eagle", "group", "fused", "sglang")
SHAPE = ("task", "prompts", "n", "steps", "max_new_tokens")  # the summary's record of the run's shape
SERVE = {"plain": {"sd": "off"}, "eagle": {"drafter": "D"}, "group": {"sd_sources": ("group",)}}
SERVE["fused"] = {"drafter": "D", "sd_sources": ("eagle", "group", "fused")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--model", default=None, help="policy directory (default: the task's bootstrap policy)")
    add("--drafter", default=None, help="EAGLE-3 drafter (default: the cached warm start)")
    add("--warm-prompts", type=int, default=256, help="without --drafter: prompts of the warm start")
    add("--warm-steps", type=int, default=400, help="without --drafter: TTT steps of the warm start")
    add("--task", default=None, help="task spec (default: the built-in task)")
    add("--prompts", type=int, default=8, help="P: prompts per step")
    add("--n", type=int, default=8, help="samples per prompt")
    add("--steps", type=int, default=2, help="consecutive steps over the same prompts")
    add("--max-new-tokens", type=int, default=512, help="the longest response")
    add("--arms", default=",".join(ARMS), help="comma-separated draft sources")
    add("--sd-max-batch", type=int, default=None, help="serve's --sd-max-batch (default: its)")
    add("--group-max-batch", type=int, default=None, help="serve's --group-max-batch (default: its)")
    add("--threads", type=int, help="torch threads of the server (default: 1) and of this process (default: torch's)")
    dtype = "weights' dtype (auto: bfloat16 where the CPU multiplies it natively)"
    add("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help=dtype)
    add("--seed", type=int, default=0, help="sampling seed")
    add("--json", default=None, help="write the results here")


def _step(engine, prompts: list[list[int]], n: int, temperature: float, max_new: int, seed: int) -> list[list[int]]:
    from gleanrl.bench.sd import timed_generate

    requests = [p for p in prompts for _ in range(n)]
    return timed_generate(engine, requests, temperature, max_new, seed, rid="bench-rollout")[1]


def _arm_config(arm: str, model: str, drafter: str, args: argparse.Namespace):
    """The EngineConfig of the arm's settings (SERVE), and the `gleanrl serve` flags that give it."""
    from gleanrl.server.config import EngineConfig

    settings = {k: drafter if v == "D" else v for k, v in SERVE[arm].items()}
    if arm != "plain":
        settings |= {k: getattr(args, k) for k in ("sd_max_batch", "group_max_batch") if getattr(args, k) is not None}
    settings |= {"dtype": args.dtype, "max_running_requests": args.prompts * args.n}
    pairs = [(f"--{k.replace('_', '-')}", ",".join(v) if isinstance(v, tuple) else str(v)) for k, v in settings.items()]
    flags = [x for pair in pairs for x in pair]
    return EngineConfig(model_path=model, **settings), flags


def _default_paths(args: argparse.Namespace) -> tuple[str, str]:
    from gleanrl import demo_setup
    from gleanrl.shipped import DEFAULT, SHIPPED, shipped_policy
    from gleanrl.trainer.bootstrap import bootstrap_policy

    task = args.task or SHIPPED[DEFAULT].task
    if args.model:
        policy = Path(args.model)
    else:  # the shipped policy answers every task in the doubling format (gleanrl.shipped)
        policy = shipped_policy() if task.startswith("doubling") else bootstrap_policy(task=args.task, seed=args.seed)
    if args.drafter:
        return str(policy), args.drafter
    warm = argparse.Namespace(**{k: getattr(args, k) for k in ("max_new_tokens", "warm_steps", "warm_prompts", "seed")})
    return str(policy), str(demo_setup.warm_drafter(policy, warm, task=task))


def _timing(seconds: float, tokens: int) -> dict:
    return {"rollout_s": round(seconds, 3), "tok_s": round(tokens / seconds, 1), "tokens": tokens}


def _arm(engine, prompts: list[list[int]], args: argparse.Namespace) -> tuple[dict, list[list[int]]]:
    """The arm's rollout steps (T = 1), then its greedy step; returns (results, greedy outputs)."""
    t0, tokens = time.perf_counter(), 0
    for step in range(args.steps):
        outs = _step(engine, prompts, args.n, 1.0, args.max_new_tokens, 10_007 * step)
        tokens += sum(map(len, outs))
    seconds = time.perf_counter() - t0
    stats, dec = engine.stats(), engine.sd_counters()
    ct = dec["verify_ct"]
    r = _timing(seconds, tokens)
    r["accept_length"] = round(dec["verify_tokens"] / ct, 2) if ct else 0.0
    r |= {"verify_passes": ct, "target_passes": dec["decode_passes"]}
    r["tokens_per_pass"] = round(dec["decode_tokens"] / dec["decode_rows"], 3) if dec["decode_rows"] else 0.0
    r["spec_accept_token_num_by_source"] = dec["spec_accept_token_num_by_source"]
    r["controller"] = stats["sd_controller"]
    return r, _step(engine, prompts, args.n, 0.0, args.max_new_tokens, 0)


def _sglang_arm(model: str, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Stock SGLang over HTTP: the same steps (T = 1, the same seeds), timed as the other arms."""
    from gleanrl.bench.engine import grpo_step, timed_requests
    from gleanrl.bench.serve_process import ServeProcess, sglang_serve_args

    count = len(prompts) * args.n
    flags = sglang_serve_args(count, max(map(len, prompts)) + args.max_new_tokens + 8)
    flags += ["--dtype", args.dtype, "--max-running-requests", str(count)]
    log = Path(tempfile.mkdtemp(prefix="gleanrl-bench-rollout-sglang-")) / "server.log"
    with ServeProcess(model, log, threads=args.threads or 1, extra=flags) as srv:
        timed_requests(srv.url, prompts[:1], [{"max_new_tokens": 8, "temperature": 0.0}])  # warm-up
        runs = [grpo_step(srv.url, prompts, args, step) for step in range(args.steps)]
    seconds, tokens = sum(t for t, _ in runs), sum(n for _, n in runs)
    return _timing(seconds, tokens) | {"serve_flags": " ".join(flags)}


def run(args: argparse.Namespace) -> int:
    import torch

    from gleanrl.bench.serve_process import sglang_missing, write_json
    from gleanrl.server.engine import Engine
    from gleanrl.server.protocol import CheckpointError
    from gleanrl.trainer.generate import encode_prompt
    from gleanrl.trainer.tasks import load_task

    arms = [a for a in args.arms.split(",") if a]
    if not arms or any(a not in ARMS for a in arms) or "plain" not in arms:
        print(f"error: --arms must list some of {ARMS}, plain included", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model, drafter = _default_paths(args)
        configs = {arm: _arm_config(arm, model, drafter, args) for arm in arms if arm != "sglang"}
        task = load_task(args.task)
    except (OSError, ValueError, KeyError, ImportError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    skipped = {"sglang": why} if "sglang" in arms and (why := sglang_missing()) else {}
    for why in skipped.values():
        print(f"skipping arm sglang: {why}", file=sys.stderr)
    results, greedy, prompts = {}, {}, None
    for arm in [a for a in arms if a != "sglang"]:
        try:
            engine = Engine(configs[arm][0])
        except (OSError, ValueError, CheckpointError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if prompts is None:
            prompts = [encode_prompt(engine.tokenizer, s) for s in task.prompts("train", args.prompts, args.seed)]
        engine.start()
        try:
            results[arm], greedy[arm] = _arm(engine, prompts, args)
        finally:
            engine.shutdown()
        r = results[arm]
        r["serve_flags"] = " ".join(configs[arm][1])
        accept = f"accept {r['accept_length']:.2f}  passes {r['verify_passes']}"
        print(f"{arm:>6}  rollout {r['rollout_s']:>8.2f} s  {r['tok_s']:>8.1f} tok/s  {accept}", flush=True)
    if "sglang" in arms and not skipped:
        r = results["sglang"] = _sglang_arm(model, prompts, args)
        print(f"sglang  rollout {r['rollout_s']:>8.2f} s  {r['tok_s']:>8.1f} tok/s (over HTTP)", flush=True)
    sd_arms = [a for a in arms if a not in ("plain", "sglang")]
    same = sum(x == y for a in sd_arms for x, y in zip(greedy[a], greedy["plain"]))
    identical = f"{same}/{len(sd_arms) * len(greedy['plain'])}"
    summary = {"arms": results, "identical_greedy": identical, "model": model, "drafter": drafter}
    summary |= {k: getattr(args, k) for k in SHAPE} | {"threads": torch.get_num_threads()}
    summary |= {f"speedup_{a}": round(results["plain"]["rollout_s"] / results[a]["rollout_s"], 2) for a in sd_arms}
    summary["skipped"] = skipped
    if "sglang" in results:
        sglang_s = results["sglang"]["rollout_s"]
        summary["over_sglang"] = {a: round(sglang_s / results[a]["rollout_s"], 2) for a in results if a != "sglang"}
        print("over stock SGLang: " + "  ".join(f"{a} {x:.2f}x" for a, x in summary["over_sglang"].items()))
    speedups = "  ".join(f"speedup_{a} {summary[f'speedup_{a}']:.2f}x" for a in sd_arms)
    print(f"{speedups}  identical greedy {identical}")
    write_json(args.json, summary)
    return 0
