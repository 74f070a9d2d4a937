"""`gleanrl demo`: the whole story on one CPU machine. Take the shipped policy (`--from-scratch`:
bootstrap one), warm-start a drafter (cached), serve it with adaptive SD on one single-thread replica
per core, run GRPO while the Harvester trains the drafter on the cores of replicas with nothing left to
run and hot-swaps it, ask the final policy three held-out questions through the `openai` client, and
write `OUT/report.md` with plots. `--regime` (trainer.tasks.presets) sets the task's lengths and fills
the step's shape where not given; the RL recipe: docs/rl-gain.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gleanrl import demo_setup as setup


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gleanrl.shipped import DEFAULT, SHIPPED
    from gleanrl.trainer.bootstrap import SIZES
    from gleanrl.trainer.tasks.presets import REGIMES

    dtypes = ["auto", "float32", "bfloat16"]
    p.add_argument("--out", default="gleanrl-demo", help="report, metrics, checkpoints and logs")
    p.add_argument("--model", help="policy directory instead of the shipped demo policy (gleanrl.shipped)")
    scratch = "bootstrap the policy (cached; --size, --seed) instead of the shipped one, which is `gleanrl bootstrap"
    p.add_argument("--from-scratch", action="store_true", help=f"{scratch} --task TASK --size SIZE --seed 0`")
    shipped = ", ".join(f"{k} ({v.task})" for k, v in SHIPPED.items())
    size = f"the policy: {shipped} are shipped; other sizes with --from-scratch"
    p.add_argument("--size", default=DEFAULT, choices=sorted(SIZES), help=size)
    regimes = ", ".join(f"{k}: {v.regime}" for k, v in SHIPPED.items())
    regime = "the task's length distribution and the step's shape (trainer.tasks.presets; default: the size's"
    regime += f", {regimes})"
    p.add_argument("--regime", default=None, choices=sorted(REGIMES), help=regime)
    p.add_argument("--steps", type=int, default=12, help="RL steps")
    recipe = "16 x 4 is the demo's RL recipe, docs/rl-gain.md"
    p.add_argument("--prompts-per-step", type=int, default=16, help=f"prompts per step (None: the regime's; {recipe})")
    p.add_argument("--samples-per-prompt", type=int, default=4, help="GRPO group size (None: the regime's)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="None: the regime's")
    lr = "policy learning rate (2e-4 hurt on 3 of 5 runs: docs/rl-gain.md)"
    p.add_argument("--lr", type=float, default=1e-4, help=lr)
    negative = "weight of negative advantages (1: plain GRPO, zero-sum per group; < 1 leans on reinforcing successes)"
    p.add_argument("--negative-weight", type=float, default=1.0, help=negative)
    every = "sampled held-out accuracy at step 0, every N steps and the last step (0: off; each costs about a minute"
    every += " on 2 cores; the demo's evidence is the reference figure at the end, free of sampling noise)"
    p.add_argument("--eval-every", type=int, default=0, help=every)
    held = "fixed held-out test prompts of the reference figure and of each sampled evaluation (0: neither)"
    p.add_argument("--eval-prompts", type=int, default=192, help=held)
    p.add_argument("--eval-samples", type=int, default=1, help="samples per held-out prompt (at T = 1)")
    dtype = "the rollout server's dtype (auto: bfloat16 on CPUs with native bf16, AVX-512 BF16 or AMX, where it is"
    dtype += " faster; float32 elsewhere, where bf16 matmuls are emulated)"
    p.add_argument("--dtype", default="auto", choices=dtypes, help=dtype)
    p.add_argument("--warm-prompts", type=int, default=64, help="prompts the drafter is warm-started on")
    warm = (
        "TTT steps of the warm start (online training improves it during RL; `gleanrl draft train` makes a strong one)"
    )
    p.add_argument("--warm-steps", type=int, default=120, help=warm)
    update = "the policy update's compute: float32, or bf16 autocast (fp32 master weights and logits; 3-4x faster on"
    update += " CPUs with AVX-512 BF16, but on deep it cut the held-out gain, 2 seeds of 2: docs/rl-gain.md)"
    p.add_argument("--update-dtype", default="float32", choices=dtypes, help=f"{update}; auto: as --dtype's")
    replicas = "rollout servers, each pinned to its share of the cores (0: one per core when the harvest runs, else"
    replicas += " one; 1: one server on every core, the harvest beside it at low priority)"
    p.add_argument("--replicas", type=int, default=0, help=replicas)
    p.add_argument("--seed", type=int, default=0, help="seed of sampling, data order and the harvest")


def closing_questions(task, seed: int, lengths=((1, 2), (3, 6), (7, 12))) -> list[dict]:
    """One held-out problem per band of lengths (doubling: its k), short to long; else the first ones."""
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
    """Held-out accuracy of the initial and final policy from the reference solutions' probabilities (the
    expectation of T = 1 accuracy, no sampling noise) and their paired gain; None without references."""
    if any(task.solution(p) is None for p in prompts):
        return None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.metrics import mean_se
    from gleanrl.trainer.phases import all_cores, phase_threads
    from gleanrl.trainer.tasks.sft import reference_accuracy

    tokenizer = AutoTokenizer.from_pretrained(initial)
    probs = []
    # the servers are gone by now: every core (the trainer left torch at its one thread)
    with phase_threads(len(all_cores())):
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
    from gleanrl.trainer.checkpoint import list_checkpoints
    from gleanrl.trainer.loop import train

    out = Path(args.out)
    task = setup.apply_regime(args)
    args.dtype, args.update_dtype = setup.fastest_cpu_dtype(args.dtype), setup.fastest_cpu_dtype(args.update_dtype)
    try:
        if not setup.fresh_out(out, "demo.json", args, ("run", "harvest", "report.md")):
            raise ValueError(f"{out} is not empty and not a demo output; choose another --out")
        policy = setup.policy_of(args)
        rl = setup.rl_config(policy, out / "run", args, args.seed, evaluate=True)  # refused before servers start
    except ValueError as exc:
        print(f"gleanrl demo: {exc}", file=sys.stderr)
        return 2
    drafter0 = setup.warm_drafter(policy, args)
    with setup.serving(policy, drafter0, out / "server.log", dtype=args.dtype, replicas=args.replicas) as servers:
        cfg = HarvestConfig(push_every=10, max_holdout=16, seed=args.seed, idle_nice=19 if args.replicas == 1 else 0)
        hooks = setup.demo_hooks(Harvester(policy, drafter0, out / "harvest" / "spool", push=None, cfg=cfg))
        log = setup.table_logger(out / "run" / "metrics.jsonl")
        train(rl, task, hooks, log=log, replicas=servers)
        url = servers.urls[0]  # every replica serves the same final policy and drafter
        closing = []
        for q in closing_questions(task, args.seed):
            answer = ask(url, q["messages"], args.max_new_tokens)
            c = {"question": q["messages"][-1]["content"], "expected": q.get("answer"), "answer": answer}
            closing.append(c | {"correct": bool(task.reward(q, answer))})
        info = httpx.get(f"{url}/model_info", timeout=30).json()
    versions = f"policy version {info.get('weight_version')}, drafter version {info.get('draft_weight_version')}"
    print(f"\nclosing questions (greedy, {versions}):")
    for c in closing:
        verdict = "right" if c["correct"] else "WRONG"
        print(f"Q: {c['question']}\nA: {c['answer']}\n   expected {c['expected']}: {verdict}")
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    reference = None
    if args.eval_prompts and (final := list_checkpoints(out / "run")):
        # the sampled eval's prompts (trainer.generate.make_rollouts)
        prompts = task.prompts("test", args.eval_prompts, args.seed * 100_003)
        reference = reference_gain(policy, final[-1][1], task, prompts)
    if reference:
        print(
            f"held-out accuracy from the reference solutions' probabilities ({reference['n']} prompts, T = 1, no "
            f"sampling noise): {reference['initial']:.3f} -> {reference['final']:.3f}, paired gain "
            f"{reference['gain']:+.3f} ± {reference['gain_se']:.3f}"
        )
    record = json.loads((out / "demo.json").read_text())
    (out / "demo.json").write_text(json.dumps(record | {"policy": str(policy), "closing": closing}, indent=1))
    report = write_report(out, rows, hooks.lengths, closing, info, reference)
    print(f"report: {report}")
    return 0
