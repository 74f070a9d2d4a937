"""Measure a policy on a task the way the RL loop samples it: response lengths (is the tail long?)
and accuracy, at temperature 1, with transformers `generate` in length-sorted batches.

    gleanrl measure MODEL_DIR [--task running_sums] [--n 1000] [--json out.json]
    gleanrl measure MODEL_DIR --reference --n 192   # no sampling: trainer.tasks.sft.reference_accuracy"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch


def length_stats(lengths: list[int]) -> dict:
    """median, p90, p99, p99/median and the share of all tokens in the longest 5 % of responses."""
    xs = sorted(lengths)
    pct = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    top = xs[len(xs) - max(1, len(xs) // 20) :]
    median = statistics.median(xs)
    return {
        "median": median,
        "p90": pct(0.90),
        "p99": pct(0.99),
        "max": xs[-1],
        "mean": round(sum(xs) / len(xs), 1),
        "p99_over_median": round(pct(0.99) / max(median, 1), 2),
        "top5_share": round(sum(top) / sum(xs), 3),
    }


@torch.no_grad()
def sample_responses(
    model,
    tokenizer,
    prompts: list[str],
    temperature: float = 1.0,
    max_new_tokens: int = 1024,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
    expected_lengths: list[int] | None = None,
) -> list[tuple[str, int]]:
    """(response text, response tokens incl. the end-of-turn token) per prompt, in order. Batches group prompts
    of similar `expected_lengths` (default: prompt length) to waste less padding."""
    from tqdm import tqdm

    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    key = expected_lengths or [len(p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: key[i])
    out: list[tuple[str, int]] = [("", 0)] * len(prompts)
    eos = tokenizer.eos_token_id
    for start in tqdm(range(0, len(order), batch_size), desc="sampling", disable=not progress):
        idx = order[start : start + batch_size]
        enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens)
        gen = model.generate(**enc, **sampling, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        for row, i in enumerate(idx):
            ids = gen[row, enc.input_ids.shape[1] :].tolist()
            n = ids.index(eos) + 1 if eos in ids else len(ids)
            out[i] = (tokenizer.decode(ids[: n - (eos in ids)]), n)
    return out


def measure_policy(
    model_dir: str,
    task=None,
    n: int = 1000,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 1024,
    batch_size: int = 64,
    progress: bool = True,
) -> dict:
    task, tokenizer, model = _load(model_dir, task)
    samples = task.prompts("test", n, seed)
    solutions = [task.solution(s) for s in samples]
    expected = None if None in solutions else [len(x) for x in solutions]
    prompts = [s["prompt"] for s in samples]
    results = sample_responses(
        model, tokenizer, prompts, temperature, max_new_tokens, batch_size, seed, progress, expected
    )
    rewards = [task.reward(s, text) for s, (text, _) in zip(samples, results)]
    lengths = [length for _, length in results]
    report = {
        "n": n,
        "temperature": temperature,
        "accuracy": round(sum(r >= 1 for r in rewards) / n, 3),
        "truncated": sum(length >= max_new_tokens for length in lengths),
        "parameters": sum(p.numel() for p in model.parameters()),
        **length_stats(lengths),
    }
    if expected is not None:  # accuracy by reference length: longer problems should be harder
        buckets: dict[str, list[float]] = {}
        for size, r in zip(expected, rewards):
            name = "<=32" if size <= 32 else "33-128" if size <= 128 else ">128"
            buckets.setdefault(name, []).append(float(r >= 1))
        report["accuracy_by_reference_chars"] = {k: (len(v), round(sum(v) / len(v), 3)) for k, v in buckets.items()}
    return report


def reference_report(model_dir: str, task=None, n: int = 192, seed: int = 0) -> dict:
    """`trainer.tasks.sft.reference_accuracy` on `n` test prompts (seed 0, n 192: the demo's held-out set)."""
    from gleanrl.trainer.tasks.sft import reference_accuracy

    task, tokenizer, model = _load(model_dir, task)
    return reference_accuracy(model, tokenizer, task, task.prompts("test", n, seed))


def _load(model_dir: str, task):
    """(the task, the policy's tokenizer, the policy in eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.tasks import load_task

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return load_task(task), AutoTokenizer.from_pretrained(model_dir), model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--task", default=None)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the report here")
    reference = "accuracy from the reference solutions' probabilities (one forward each, no sampling; the task needs "
    reference += "solution())"
    parser.add_argument("--reference", action="store_true", help=reference)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.reference:
        report = reference_report(args.model_dir, args.task, args.n, args.seed)
    else:
        report = measure_policy(
            args.model_dir, args.task, args.n, args.seed, args.temperature, args.max_new_tokens, args.batch_size
        )
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
