"""Paired gains of RL runs on the built-in `doubling` task (docs/rl-gain.md, issue 23).

    python scripts/rl_gain.py POLICY RUN_DIR [RUN_DIR ...]                   # dev set and batch reward
    python scripts/rl_gain.py POLICY RUN_DIR ... --heldout [--blind --json F]  # and the held-out figures

Per run, its last checkpoint against POLICY: the reference paired gain on dev (`train`) problems the RL
steps never drew, the batch reward, and with --heldout the test figures (`--blind`: to --json only).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

BUCKETS = {"k<=3": (0, 3), "4<=k<=17": (4, 17), "k>17": (18, 99)}


def paired(a: list[float], b: list[float]) -> dict:
    """Mean of b - a prompt by prompt, its se over prompts and z."""
    from gleanrl.trainer.metrics import mean_se

    n = len(a)
    if n < 2:
        return {"n": n} | dict.fromkeys(("initial", "final", "gain", "se", "z"), math.nan)
    gain, se = mean_se([y - x for x, y in zip(a, b)])
    z = gain / se if se else math.nan
    return {"n": n, "initial": sum(a) / n, "final": sum(b) / n, "gain": gain, "se": se, "z": z}


def by_k(a: list[float], b: list[float], samples: list[dict], lo: int, hi: int):
    """The entries of a and b whose problem has lo <= k <= hi doublings."""
    keep = [i for i, s in enumerate(samples) if lo <= s["steps"] <= hi]
    return [a[i] for i in keep], [b[i] for i in keep]


def show(name: str, g: dict, digits: int = 4) -> str:
    gain = f"gain {g['gain']:+.{digits}f} ± {g['se']:.{digits}f} (z {g['z']:+.1f})"
    return f"{name} {g['initial']:.3f} -> {g['final']:.3f}, {gain}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("policy", help="the runs' initial policy")
    p.add_argument("runs", nargs="+")
    p.add_argument("--heldout", action="store_true", help="also the held-out (test split) figures")
    p.add_argument("--blind", action="store_true", help="with --heldout: into --json only, not printed")
    p.add_argument("--dev-prompts", type=int, default=512)
    p.add_argument("--dev-seed", type=int, default=777_777_777)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="append one JSON line per run here")
    p.add_argument("--cache", default=None, help="a JSON file caching the initial policy's probabilities")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.checkpoint import list_checkpoints
    from gleanrl.trainer.tasks import load_task
    from gleanrl.trainer.tasks.sft import reference_accuracy

    torch.set_num_threads(args.threads)
    task = load_task("doubling")
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    disk = json.loads(Path(args.cache).read_text()) if args.cache and Path(args.cache).exists() else {}
    memo: dict[str, list[float]] = {}

    def probs(path: str, samples: list[dict], key: list) -> list[float]:
        """P(reference) per prompt; the initial policy's are cached on disk (`--cache`)."""
        name = json.dumps([str(Path(path).resolve()), key, len(samples)])
        initial = path == args.policy
        if initial and name in disk:
            return disk[name]
        if name not in memo:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            with torch.no_grad():
                memo[name] = reference_accuracy(model, tokenizer, task, samples, per_prompt=True)["probs"]
        if initial and args.cache:
            disk[name] = memo[name]
            Path(args.cache).write_text(json.dumps(disk))
        return memo[name]

    dev = task.prompts("train", args.dev_prompts, args.dev_seed)
    for run in map(Path, args.runs):
        cfg = json.loads((run / "config.resolved.json").read_text())
        step, final = list_checkpoints(run)[-1]
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rewards = [r["reward_mean"] for r in rows if r["step"] > 0 and "reward_mean" in r]
        half = rewards[len(rewards) // 2 :]
        a = probs(args.policy, dev, ["dev", args.dev_seed])
        b = probs(str(final), dev, ["dev", args.dev_seed])
        out = {"run": str(run), "seed": cfg["seed"], "step": step}
        out |= {k: cfg[k] for k in ("lr", "negative_weight", "kl_coef")} | {
            "shape": f"{cfg['prompts_per_step']}x{cfg['samples_per_prompt']}",
            "batch_reward": sum(rewards) / max(1, len(rewards)),
            "batch_reward_2nd_half": sum(half) / max(1, len(half)),
            "dev": paired(a, b),
            "dev_by_k": {name: paired(*by_k(a, b, dev, lo, hi)) for name, (lo, hi) in BUCKETS.items()},
        }
        line = (
            f"{run}: seed {cfg['seed']} step {step} {out['shape']} lr {cfg['lr']:g} "
            f"nw {cfg['negative_weight']:g} kl {cfg['kl_coef']:g} | batch reward {out['batch_reward']:.3f} "
            f"(2nd half {out['batch_reward_2nd_half']:.3f}) | {show('dev reference', out['dev'])} | by k: "
            + ", ".join(f"{k} {v['gain']:+.3f}±{v['se']:.3f}" for k, v in out["dev_by_k"].items())
        )
        if args.heldout:
            evals = [r for r in rows if "eval_accuracy" in r]
            n = evals[0]["eval_prompts"]
            tests = task.prompts("test", n, cfg["seed"] * 100_003)
            key = ["test", cfg["seed"]]
            reference = paired(probs(args.policy, tests, key), probs(str(final), tests, key))
            last = [r for r in evals if "eval_gain" in r][-1]
            gain, se = last["eval_gain"], last["eval_gain_se"]
            sampled = {"n": n, "initial": evals[0]["eval_accuracy"], "final": last["eval_accuracy"], "gain": gain}
            sampled |= {"se": se, "z": gain / se if se else math.nan}
            out |= {"heldout_sampled": sampled, "heldout_reference": reference}
            if not args.blind:
                line += f"\n    {show('held-out sampled', sampled, 3)} | {show('held-out reference', reference)}"
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
