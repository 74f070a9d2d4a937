"""`gleanrl bench sd`: output tokens/s with speculative decoding against without, in one engine.

Two engines as `gleanrl serve` builds them, one with the drafter (`--sd`, default adaptive), one `--sd off`; same model,
prompts (a task's, or a JSONL file), threads and batching. Per batch size and temperature: one warm-up run per side (the
controller measures its costs), then `--repeats` alternating runs, the best counting (the CPU may be shared). Requests
stop at EOS; tokens/s counts the tokens produced. accept_length: mean tokens per verify pass (bonus included, as
SGLang's; 0: SD never ran). At temperature 0 the SD and plain outputs are compared token for token; `diverged` says
where one left the other, with the plain engine's log-probability gap of the two tokens there (`sd_checks.divergence`: a
gap within bf16's rounding is a near-tie, not a bug). `per_iteration` splits each arm's decode iteration (ms) into
target forwards, drafter calls and the rest, from `Engine.sd_counters`. `draft_cost_ratio`: the drafter's ms per draft
token over plain decoding's ms per iteration, at 1 running.

With `--json-schema` (or `--regex`) each cell also runs both sides under its xgrammar mask and reports, under `grammar`,
the same figures masked and the grammar's cost per output token: `ms_per_token` (the matcher's mask and accept, replayed
over the plain outputs) and `overhead_ms_per_token` (plain decoding's time per token masked minus unmasked).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from gleanrl.bench.sd_checks import compile_grammar, divergence, matcher_ms_per_token
from gleanrl.bench.serve_process import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="target model directory (default: the shipped demo policy)")
    parser.add_argument("--drafter", default=None, help="EAGLE-3 drafter directory (default: the shipped warm start)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--task", default=None, help="task whose test prompts are used (default: the built-in task)")
    parser.add_argument("--prompts", default=None, help='JSONL file of {"prompt": text} instead of --task')
    parser.add_argument("--batches", default="1,4,16", help="running requests per cell, comma-separated")
    parser.add_argument("--temperatures", default="0,1", help="sampling temperatures, comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="tokens per request")
    sd = "on: SD at every batch; adaptive: as serve's --sd"
    parser.add_argument("--sd", choices=["on", "adaptive"], default="adaptive", help=sd)
    parser.add_argument("--sd-max-batch", type=int, default=None, help="serve's --sd-max-batch (default: its)")
    parser.add_argument("--num-draft-tokens", type=int, default=None, help="fixed draft length (default: chosen)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the engine runs")
    dtype = "weights of target and drafter (auto: bfloat16 on CUDA and on CPUs that multiply bf16 natively, AVX-512"
    dtype += " BF16 or AMX, as the other benches; else float32)"
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help=dtype)
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (the best counts)")
    grammar = parser.add_mutually_exclusive_group()
    schema = "also run every cell under this JSON schema's grammar (a schema as JSON text, a file holding one, or"
    grammar.add_argument("--json-schema", default=None, help=f"{schema} 'any' for any JSON)")
    regex = "also run every cell under this regular expression's grammar (e.g. the task's own answer format, so that"
    grammar.add_argument("--regex", default=None, help=f"{regex} the constrained text is the text the policy writes)")


ARGS_RECORDED = ("model", "drafter", "sd", "threads", "device", "dtype", "max_new_tokens", "json_schema", "regex")


def _prompts(args: argparse.Namespace, n: int) -> list[str]:
    from gleanrl.draft_train import prompts_file
    from gleanrl.trainer.tasks import load_task

    if args.prompts:
        texts = prompts_file(args.prompts)
    else:
        texts = [p["prompt"] for p in load_task(args.task).prompts("test", n, 0)]
    if not texts:
        raise ValueError("no prompts")
    return [texts[i % len(texts)] for i in range(n)]


def timed_generate(
    engine, prompts: list[list[int]], temp: float, max_new: int, seed: int, grammar=None, rid: str = "bench-sd"
) -> tuple[float, list]:
    from gleanrl.server.protocol import GenerateRequest, SamplingParams

    async def one(i: int) -> list[int]:
        params = SamplingParams(max_new_tokens=max_new, temperature=temp, seed=seed + i, grammar=grammar)
        req = GenerateRequest(rid=f"{rid}-{time.monotonic_ns()}-{i}", input_ids=prompts[i], params=params)
        return [t async for out in engine.generate(req) for t in out.new_ids]

    async def main() -> list[list[int]]:
        return await asyncio.gather(*[one(i) for i in range(len(prompts))])

    start, outputs = time.perf_counter(), asyncio.run(main())
    return sum(map(len, outputs)) / (time.perf_counter() - start), outputs


def _breakdown(before: dict, after: dict) -> dict[str, float]:
    """ms per decode iteration between two `Engine.sd_counters()`: the whole iteration, its target forwards, its drafter
    calls, and the overhead outside them (planning, drafting bookkeeping, verification, sampling, state updates)."""
    n = max(after["iterations"] - before["iterations"], 1)
    ms = {k: 1e3 * (after[f"{k}_s"] - before[f"{k}_s"]) / n for k in ("iteration", "forward", "drafter")}
    ms["overhead"] = ms["iteration"] - ms["forward"] - ms["drafter"]
    return {f"{k}_ms": round(v, 3) for k, v in ms.items()}


def _cell(sd, off, prompts, temp: float, args, grammar=None) -> dict:
    """One batch and temperature: warm-up, then alternating runs (the best counts)."""
    timed_generate(sd, prompts, temp, args.max_new_tokens, 0, grammar)  # the controller measures
    timed_generate(off, prompts, temp, args.max_new_tokens, 0, grammar)
    before, plain_before = sd.sd_counters(), off.sd_counters()
    sd_tok_s = plain_tok_s = 0.0
    identical, plain_outputs, diverged = 0, [], []
    for r in range(args.repeats):
        sd_rate, sd_out = timed_generate(sd, prompts, temp, args.max_new_tokens, 1000 * r, grammar)
        plain_rate, plain_out = timed_generate(off, prompts, temp, args.max_new_tokens, 1000 * r, grammar)
        sd_tok_s, plain_tok_s = max(sd_tok_s, sd_rate), max(plain_tok_s, plain_rate)
        same = [a == b for a, b in zip(sd_out, plain_out)]
        identical += sum(same)
        if temp == 0:
            diverged += [divergence(off, p, b, a) for p, a, b, ok in zip(prompts, sd_out, plain_out, same) if not ok]
        plain_outputs += plain_out
    after = sd.sd_counters()
    ct, toks = (after[k] - before[k] for k in ("verify_ct", "verify_tokens"))
    out = {
        "sd_tok_s": round(sd_tok_s, 1),
        "plain_tok_s": round(plain_tok_s, 1),
        "speedup": round(sd_tok_s / plain_tok_s, 2),
        "accept_length": round(toks / ct, 2) if ct else 0.0,
        "per_iteration": {"sd": _breakdown(before, after), "plain": _breakdown(plain_before, off.sd_counters())},
    }
    if temp == 0:  # lossless: greedy outputs with and without SD are the same tokens
        out["identical_outputs"] = f"{identical}/{len(prompts) * args.repeats}"
        out["diverged"] = diverged  # each: where, the two tokens, their plain log-probability gap
    if grammar is not None:
        vocab = off.info()["vocab_size"]
        out["ms_per_token"] = round(matcher_ms_per_token(grammar, plain_outputs, vocab), 4)
    return out


def _draft_cost(sd, off, prompt: list[list[int]], results: list[dict], args) -> dict:
    """`draft_cost_ratio`: the drafter's ms per draft token (the controller's EMA at 1 running) over
    plain decoding's ms per iteration at 1 running (the batch-1 cells', else one greedy request's).
    Above ~1 / (1 + accepted tokens per chain) a chain cannot pay."""
    steps = (sd.stats().get("sd_controller") or {}).get("drafter_step_ms") or {}
    drafter_ms = steps.get(1, steps[min(steps)] if steps else float("nan"))
    plain = [r["per_iteration"]["plain"]["iteration_ms"] for r in results if r["batch"] == 1]
    if not plain:
        before = off.sd_counters()
        timed_generate(off, prompt, 0.0, args.max_new_tokens, 0)
        plain = [_breakdown(before, off.sd_counters())["iteration_ms"]]
    plain_ms = min(plain)
    ratio = round(drafter_ms / plain_ms, 3) if plain_ms > 0 else None
    return {"draft_cost_ratio": ratio, "drafter_ms_per_token": drafter_ms, "plain_iteration_ms": plain_ms}


def _line(r: dict) -> str:
    line = f"SD {r['sd_tok_s']:>8.1f} tok/s  plain {r['plain_tok_s']:>8.1f} tok/s  "
    line += f"{r['speedup']:.2f}x  accept {r['accept_length']:.2f}"
    line += f"  identical {r['identical_outputs']}" if "identical_outputs" in r else ""
    gaps = [d.get("logprob_gap") for d in r.get("diverged") or []]
    return line + (f" (log-prob gaps where they diverge {gaps})" if gaps else "")


def run(args: argparse.Namespace) -> int:
    import torch

    from gleanrl.demo_setup import fastest_cpu_dtype
    from gleanrl.server.config import EngineConfig
    from gleanrl.server.engine import Engine
    from gleanrl.server.protocol import CheckpointError
    from gleanrl.shipped import shipped_drafter, shipped_policy

    torch.set_num_threads(args.threads)
    if args.device == "cpu":
        args.dtype = fastest_cpu_dtype(args.dtype)
    args.model = args.model or str(shipped_policy())
    args.drafter = args.drafter or str(shipped_drafter())
    batches = [int(b) for b in args.batches.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    try:
        prompts_text = _prompts(args, max(batches))
        common = dict(model_path=args.model, max_running_requests=64, device=args.device, dtype=args.dtype)
        sd_flags = dict(sd=args.sd, num_draft_tokens=args.num_draft_tokens)
        sd_flags |= {"sd_max_batch": args.sd_max_batch} if args.sd_max_batch is not None else {}
        sd = Engine(EngineConfig(**common, drafter=args.drafter, **sd_flags))
        off = Engine(EngineConfig(**common, sd="off"))
        grammar = compile_grammar(off, args.json_schema, args.regex)
    except (OSError, ValueError, KeyError, ImportError, CheckpointError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sd.start()
    off.start()
    prompts = [sd.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts_text]
    results = []
    try:
        for batch in batches:
            for temp in temps:
                r = {"batch": batch, "temperature": temp, **_cell(sd, off, prompts[:batch], temp, args)}
                print(f"batch {batch:>3} T={temp:<4} {_line(r)}", flush=True)
                split = "  ".join(
                    f"{arm} {x['iteration_ms']:.2f} ({x['forward_ms']:.2f} / {x['drafter_ms']:.2f} / "
                    f"{x['overhead_ms']:.2f})"
                    for arm, x in r["per_iteration"].items()
                )
                print(f"    ms per iteration (forward / drafter / overhead): {split}", flush=True)
                if grammar is not None:
                    g = r["grammar"] = _cell(sd, off, prompts[:batch], temp, args, grammar)
                    g["overhead_ms_per_token"] = round(1000 / g["plain_tok_s"] - 1000 / r["plain_tok_s"], 4)
                    print(
                        f"  with grammar  {_line(g)}  grammar {g['ms_per_token']:.3f} ms/token"
                        f" (plain overhead {g['overhead_ms_per_token']:.3f})",
                        flush=True,
                    )
                results.append(r)
        draft_cost = _draft_cost(sd, off, prompts[:1], results, args)
        print(
            f"draft_cost_ratio {draft_cost['draft_cost_ratio']} (drafter "
            f"{draft_cost['drafter_ms_per_token']} ms per draft token / plain iteration "
            f"{draft_cost['plain_iteration_ms']} ms, 1 running)",
            flush=True,
        )
    finally:
        sd.shutdown()
        off.shutdown()
    write_json(args.json, {**{k: getattr(args, k) for k in ARGS_RECORDED}, **draft_cost, "results": results})
    return 0
