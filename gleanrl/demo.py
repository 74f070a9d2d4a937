"""`gleanrl demo`: the whole story on one CPU machine. Bootstrap the built-in task's policy
(cached), warm-start a drafter (cached), start the embedded server with adaptive SD, run GRPO while
the Harvester trains the drafter in each step's long tail and hot-swaps it, then ask the final
policy and drafter three held-out questions (short to long, greedy) through the official `openai`
client, and write
`OUT/report.md` with plots. The policy is the one shipped with the project (`gleanrl.shipped`,
checked before use); `--from-scratch` bootstraps it instead.

Cores (`trainer.layout`): one single-thread rollout server per core (`--replicas`), each pinned to
its core, a prompt's samples on one of them; when a replica has nothing left to run while another
still decodes its tail, the harvest (capture, drafter training) runs on the free core, pinned, the
way a GPU cluster's rollout devices whose rollouts finished would take it. The policy update, which
runs while the servers wait, takes every core.

`--regime` (trainer.tasks.presets): the task's length distribution and the step's shape; its values
fill --max-new-tokens, --prompts-per-step and --samples-per-prompt unless they are given. The demo
gives the step's shape itself: its RL recipe (docs/rl-gain.md, issue 23) is 16 prompts x 4 samples a
step (the regime's 8 x 8 rollouts over twice the prompts), lr 1e-4, negative_weight 1 (plain
GRPO advantages).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gleanrl.demo_rl import demo_hooks, rl_config, serving, table_logger
from gleanrl.demo_setup import apply_regime, fastest_cpu_dtype, fresh_out, policy_of, warm_drafter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="gleanrl-demo", help="report, metrics, checkpoints and logs")
    p.add_argument(
        "--model", default=None, help="policy directory instead of the shipped demo policy (gleanrl.shipped)"
    )
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="bootstrap the policy (cached; --size, --seed) instead of the shipped one, "
        "which is `gleanrl bootstrap --task TASK --size SIZE --seed 0`",
    )
    from gleanrl.shipped import DEFAULT, SHIPPED
    from gleanrl.trainer.bootstrap import SIZES

    p.add_argument(
        "--size",
        default=DEFAULT,
        choices=sorted(SIZES),
        help="the policy: "
        + ", ".join(f"{k} ({v.task})" for k, v in SHIPPED.items())
        + " are shipped; other sizes with --from-scratch",
    )
    from gleanrl.trainer.tasks.presets import REGIMES

    p.add_argument(
        "--regime",
        default=None,
        choices=sorted(REGIMES),
        help="the task's length distribution and the step's shape "
        "(trainer.tasks.presets; default: the size's, "
        + ", ".join(f"{k}: {v.regime}" for k, v in SHIPPED.items())
        + ")",
    )
    p.add_argument("--steps", type=int, default=12, help="RL steps")
    p.add_argument(
        "--prompts-per-step",
        type=int,
        default=16,
        help="prompts per step (None: the regime's; 16 x 4 is the demo's RL recipe, docs/rl-gain.md)",
    )
    p.add_argument("--samples-per-prompt", type=int, default=4, help="GRPO group size (None: the regime's)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="None: the regime's")
    p.add_argument(
        "--lr", type=float, default=1e-4, help="policy learning rate (2e-4 hurt on 3 of 5 runs: docs/rl-gain.md)"
    )
    p.add_argument(
        "--negative-weight",
        type=float,
        default=1.0,
        help="weight of negative advantages (1: plain GRPO, zero-sum per group; < 1 leans on reinforcing successes)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="sampled held-out accuracy at step 0, every N steps and the last step "
        "(0: off; each costs about a minute on 2 cores; the demo's evidence is "
        "the reference figure at the end, free of sampling noise)",
    )
    p.add_argument(
        "--eval-prompts",
        type=int,
        default=192,
        help="fixed held-out test prompts of the reference figure and of each sampled evaluation (0: neither)",
    )
    p.add_argument("--eval-samples", type=int, default=1, help="samples per held-out prompt (at T = 1)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="the rollout server's dtype (auto: bfloat16 on CPUs with native bf16, "
        "AVX-512 BF16 or AMX, where it is faster; float32 elsewhere, where bf16 "
        "matmuls are emulated)",
    )
    p.add_argument("--warm-prompts", type=int, default=64, help="prompts the drafter is warm-started on")
    p.add_argument(
        "--warm-steps",
        type=int,
        default=120,
        help="TTT steps of the warm start (online training "
        "improves it during RL; `gleanrl draft train` makes a strong one)",
    )
    p.add_argument(
        "--update-dtype",
        default="float32",
        choices=["auto", "float32", "bfloat16"],
        help="the policy update's compute: float32, or bf16 autocast (fp32 master "
        "weights and logits; 3-4x faster on CPUs with AVX-512 BF16, but on deep "
        "it cut the held-out gain, 2 seeds of 2: docs/rl-gain.md); auto: as "
        "--dtype's",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="rollout servers, each pinned to its share of the cores (0: one per core "
        "when the harvest runs, else one; 1: one server on every core, the "
        "harvest beside it at low priority)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of sampling, data order and the harvest")


def closing_questions(task, seed: int, lengths=((1, 2), (3, 6), (7, 12))) -> list[dict]:
    """One held-out (test split) problem per band of lengths (doubling: its k), short to long; the
    first test problems where the task has no lengths."""
    tests = task.prompts("test", 256, seed)
    picked = [next((s for s in tests if lo <= s.get("steps", -1) <= hi), None) for lo, hi in lengths]
    return [s for s in picked if s is not None] or tests[: len(lengths)]


def ask(url: str, question: list[dict], max_tokens: int) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="demo")
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=question, max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content or ""


def reference_gain(initial: Path, final: Path, task, prompts: list[dict]) -> dict | None:
    """Held-out accuracy of the initial and final policy from the reference solutions' probabilities
    (trainer.tasks.sft.reference_accuracy: for the built-in task, the expectation of T = 1 accuracy,
    with no sampling noise), and their paired gain prompt by prompt; None if the task has no
    reference solutions."""
    if any(task.solution(p) is None for p in prompts):
        return None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.metrics import mean_se
    from gleanrl.trainer.tasks.sft import reference_accuracy

    tokenizer = AutoTokenizer.from_pretrained(initial)
    probs = []
    for path in (initial, final):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        probs.append(reference_accuracy(model, tokenizer, task, prompts, per_prompt=True)["probs"])
    n = len(prompts)
    gain, se = mean_se([b - a for a, b in zip(*probs)])
    return {"n": n, "initial": sum(probs[0]) / n, "final": sum(probs[1]) / n, "gain": gain, "gain_se": se}


def run(args: argparse.Namespace) -> int:
    import httpx

    from gleanrl.demo_report import write_report
    from gleanrl.harvest.config import HarvestConfig
    from gleanrl.harvest.harvester import Harvester
    from gleanrl.trainer.loop import train

    out = Path(args.out)
    task = apply_regime(args)
    args.dtype, args.update_dtype = fastest_cpu_dtype(args.dtype), fastest_cpu_dtype(args.update_dtype)
    if not fresh_out(out, "demo.json", args, ("run", "harvest", "report.md")):
        print(f"gleanrl demo: {out} is not empty and not a demo output; choose another --out", file=sys.stderr)
        return 2
    try:
        policy = policy_of(args)
    except ValueError as exc:
        print(f"gleanrl demo: {exc}", file=sys.stderr)
        return 2
    drafter0 = warm_drafter(policy, args)
    with serving(policy, drafter0, out / "server.log", dtype=args.dtype, replicas=args.replicas) as servers:
        harvester = Harvester(
            policy,
            drafter0,
            out / "harvest" / "spool",
            push=None,
            cfg=HarvestConfig(push_every=10, max_holdout=16, seed=args.seed, idle_nice=19 if args.replicas == 1 else 0),
        )
        hooks = demo_hooks(harvester)
        train(
            rl_config(policy, out / "run", args, args.seed, evaluate=True),
            task=task,
            hooks=hooks,
            log=table_logger(out / "run" / "metrics.jsonl"),
            replicas=servers,
        )
        url = servers.urls[0]  # every replica serves the same final policy and drafter
        closing = [
            {
                "question": q["messages"][-1]["content"],
                "expected": q.get("answer"),
                "answer": (a := ask(url, q["messages"], args.max_new_tokens)),
                "correct": bool(task.reward(q, a)),
            }
            for q in closing_questions(task, args.seed)
        ]
        info = httpx.get(f"{url}/model_info", timeout=30).json()
    print(
        f"\nclosing questions (greedy, policy version {info.get('weight_version')}, drafter "
        f"version {info.get('draft_weight_version')}):"
    )
    for c in closing:
        print(
            f"Q: {c['question']}\nA: {c['answer']}\n   expected {c['expected']}: {'right' if c['correct'] else 'WRONG'}"
        )
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    reference = None
    if args.eval_prompts:
        # the sampled eval's prompts (trainer.generate.make_rollouts)
        from gleanrl.trainer.checkpoint import list_checkpoints

        final = list_checkpoints(out / "run")
        if final:
            reference = reference_gain(
                policy, final[-1][1], task, task.prompts("test", args.eval_prompts, args.seed * 100_003)
            )
    if reference:
        print(
            f"held-out accuracy from the reference solutions' probabilities ({reference['n']} "
            f"prompts, T = 1, no sampling noise): {reference['initial']:.3f} "
            f"-> {reference['final']:.3f}, paired gain {reference['gain']:+.3f} "
            f"± {reference['gain_se']:.3f}"
        )
    record = json.loads((out / "demo.json").read_text())
    (out / "demo.json").write_text(json.dumps(record | {"policy": str(policy), "closing": closing}, indent=1))
    report = write_report(out, rows, hooks.lengths, closing, info, reference)
    print(f"report: {report}")
    return 0
