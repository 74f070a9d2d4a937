"""`gleanrl bench engine`: output tokens/s of the embedded engine against transformers `generate`.

Same model, same prompts, same number of output tokens per request (EOS ignored on both sides), same
torch thread count, one warm-up run each, then `--repeats` alternating runs of which the best counts.
The baseline is what a plain transformers user does:
- batch 1: `model.generate(ids, generation_config=...)` greedy, `max_new_tokens=n`, with the
  config's `eos_token_id` cleared (no stopping, no logits processor: its cheapest way to emit n tokens);
- batch 16 (mixed lengths): one left-padded `generate` call for all 16 prompts the same way with
  `max_new_tokens = max(lengths)` (static batching: every row runs until the longest is done),
  credited only with the tokens each request asked for (sum of lengths).
The engine serves the same requests concurrently (`ignore_eos`, each with its own `max_new_tokens`).
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import time

PROMPTS = ["Question: what is 12 + 30? Answer:", "def add(a, b):", "Hello, world! How are you today?",
           "The quick brown fox jumps over the lazy dog.", "Speculative decoding drafts a few tokens and",
           "Reinforcement learning from verifiable rewards samples many answers", "print(add(2, 3))", "0123"]


def mixed_lengths(batch: int, longest: int) -> list[int]:
    """A long tail: most requests short, a few long (as RL rollouts)."""
    return [max(4, int(longest * ((i + 1) / batch) ** 2)) for i in range(batch)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="the longest request's output length")
    parser.add_argument("--batch1-tokens", type=int, default=128, help="output length at batch 1")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side and case (the best one counts)")


def _engine_run(engine, prompts: list[list[int]], lengths: list[int]) -> float:
    from gleanrl.server.protocol import GenerateRequest, SamplingParams

    async def one(i: int) -> int:
        req = GenerateRequest(rid=f"bench-{time.monotonic_ns()}-{i}", input_ids=prompts[i],
                              params=SamplingParams(max_new_tokens=lengths[i], temperature=0.0, ignore_eos=True))
        return sum([len(out.new_ids) async for out in engine.generate(req)])

    async def main() -> list[int]:
        return await asyncio.gather(*[one(i) for i in range(len(prompts))])

    start = time.perf_counter()
    produced = asyncio.run(main())
    elapsed = time.perf_counter() - start
    assert produced == lengths, (produced, lengths)
    return sum(lengths) / elapsed


def _hf_run(model, tokenizer, prompts: list[list[int]], lengths: list[int]) -> float:
    import torch

    longest = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    config = copy.deepcopy(model.generation_config)
    config.update(eos_token_id=None, max_new_tokens=max(lengths), do_sample=False, pad_token_id=pad)
    n = max(lengths)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    elapsed = time.perf_counter() - start
    assert out.shape[1] == longest + n
    return sum(lengths) / elapsed


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from gleanrl.server.config import EngineConfig
    from gleanrl.server.engine import Engine

    torch.set_num_threads(args.threads)
    try:
        engine = Engine(EngineConfig(model_path=args.model, max_running_requests=64))
    except (OSError, ValueError) as exc:
        print(f"error: cannot load {args.model}: {exc}", file=sys.stderr)
        return 2
    engine.start()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tok = engine.tokenizer
    cases = [(1, [args.batch1_tokens]), (16, mixed_lengths(16, args.max_new_tokens))]
    results = []
    try:
        for batch, lengths in cases:
            prompts = [tok(PROMPTS[i % len(PROMPTS)] * (1 + i % 3))["input_ids"] for i in range(batch)]
            _engine_run(engine, prompts, [8] * batch)  # warm-up
            _hf_run(model, tok, prompts, [8] * batch)
            engine_tok_s = hf_tok_s = 0.0
            for _ in range(args.repeats):  # alternate and keep the best: the CPU may be shared
                engine_tok_s = max(engine_tok_s, _engine_run(engine, prompts, lengths))
                hf_tok_s = max(hf_tok_s, _hf_run(model, tok, prompts, lengths))
            results.append({"batch": batch, "engine_tok_s": round(engine_tok_s, 1), "hf_tok_s": round(hf_tok_s, 1),
                            "ratio": round(engine_tok_s / hf_tok_s, 2), "output_tokens": sum(lengths)})
    finally:
        engine.shutdown()
    print(f"{'batch':>5} {'engine tok/s':>13} {'hf tok/s':>10} {'ratio':>6}")
    for r in results:
        print(f"{r['batch']:>5} {r['engine_tok_s']:>13.1f} {r['hf_tok_s']:>10.1f} {r['ratio']:>5.2f}x")
    if args.json:
        from gleanrl.harvest.atomic import atomic_file
        with atomic_file(args.json, "w") as f:
            json.dump({"model": args.model, "threads": args.threads, "results": results}, f, indent=2)
    return 0
