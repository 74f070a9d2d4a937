"""`gleanrl draft train` (and `warm_start()`): warm-start an EAGLE-3 drafter offline from the target's own
generations: sample with the embedded engine, capture aux hidden states and soft labels on prompt +
response, train with TTT on response tokens, report held-out acceptance length, save atomically."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from gleanrl.base.flags import add_flags, check_fields, config_from_args, flag
from gleanrl.harvest.capture import Sample, capture
from gleanrl.harvest.checkpoint import load_drafter, save_drafter
from gleanrl.harvest.cli_init import init_drafter, parse_layer_ids
from gleanrl.harvest.drafter import Eagle3Drafter
from gleanrl.harvest.train_step import acceptance_length, bf16_fast, length_batches, make_optimizer, train_step


@dataclass
class WarmStartConfig:
    max_new_tokens: int = flag(128, "response tokens generated per prompt")
    temperature: float = flag(1.0, "sampling temperature (0 = greedy)")
    gen_batch: int = flag(16, "requests generated concurrently / sequences per capture batch")
    steps: int = flag(200, "optimizer steps")
    batch_size: int = flag(16, "most sequences per step")
    # a longer sequence goes alone
    batch_tokens: int = flag(2048, "most padded tokens per step (similar lengths are batched together)")
    lr: float = flag(1e-3, "AdamW learning rate (decays linearly to a tenth)")
    precision: str = flag("auto", "auto (bf16 autocast where the CPU/GPU has fast bf16), bf16 or fp32")
    ttt_length: int = flag(4, "unrolled draft steps (TTT)")
    topk: int = flag(64, "soft-label top-k of the target distribution")
    heldout: float = flag(0.1, "fraction of generations held out")
    eval_every: int = flag(50, "steps between held-out acceptance evaluations")
    accept_k: int = flag(4, "draft length for acceptance")
    seed: int = flag(0, "seed for prompts, sampling and init")

    def __post_init__(self) -> None:
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        counts = ("max_new_tokens", "gen_batch", "steps", "batch_size", "batch_tokens", "ttt_length", "topk")
        check_fields(self, (*counts, "eval_every", "accept_k"))
        if not 0 < self.heldout < 1 or self.temperature < 0 or self.lr <= 0:
            raise ValueError("need 0 < heldout < 1, temperature >= 0, lr > 0")


def use_bf16(cfg: WarmStartConfig, device: str = "cpu") -> bool:
    return cfg.precision == "bf16" or (cfg.precision == "auto" and bf16_fast(device))


def generate(
    model_dir: str | Path, tokenizer, prompts: list[str], cfg: WarmStartConfig, device: str = "cpu"
) -> list[tuple[list[int], int]]:
    """(prompt + response token ids, prompt length) per prompt, sampled by the embedded engine (continuous
    batching: long-tailed responses hold no padded batch; bf16 where fast, as it would serve)."""
    import asyncio

    from gleanrl.server.config import EngineConfig
    from gleanrl.server.engine import Engine
    from gleanrl.server.protocol import GenerateRequest, SamplingParams

    dtype = "bfloat16" if use_bf16(cfg, device) else "float32"
    config = dict(model_path=str(model_dir), device=device, max_running_requests=cfg.gen_batch, dtype=dtype)
    engine = Engine(EngineConfig(**config, seed=cfg.seed))
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    bar = tqdm(total=len(prompts), desc="generate", unit="seq")

    async def one(i: int) -> list[int]:
        seed = cfg.seed * 100003 + i
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed)
        ids, reason = [], None
        async for out in engine.generate(GenerateRequest(rid=f"warm-{i}", input_ids=encoded[i], params=params)):
            ids += out.new_ids
            reason = out.finish_reason
        matched = (reason or {}).get("matched")
        if isinstance(matched, int) and (not ids or ids[-1] != matched):
            ids.append(matched)  # responses end at EOS (kept), as the drafter learns to draft it
        bar.update()
        return ids

    async def main() -> list[list[int]]:
        return await asyncio.gather(*[one(i) for i in range(len(prompts))])

    engine.start()
    try:
        responses = asyncio.run(main())
    finally:
        engine.shutdown()
        bar.close()
    return [(p + r, len(p)) for p, r in zip(encoded, responses)]


def warm_start(
    model_dir: str | Path,
    prompts: list[str],
    cfg: WarmStartConfig,
    init: str | Path | None = None,
    layer_ids: list[int] | None = None,
    log=None,
    checkpoint: str | Path | None = None,
    device: str = "cpu",
) -> tuple[Eagle3Drafter, list[dict]]:
    """Train a drafter for the target in `model_dir` on its generations for `prompts` -> (drafter, history);
    with `checkpoint`, also saved there (atomically) at every evaluation, so an interrupted run keeps it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    drafter = load_drafter(init, target_config=model.config) if init else init_drafter(model_dir, cfg.seed, layer_ids)
    drafter = drafter.to(device)
    bf16 = use_bf16(cfg, device)
    seqs = generate(model_dir, tokenizer, prompts, cfg, device)
    captured: list[Sample] = []
    # similar lengths per capture batch: little padding
    seqs = sorted(seqs, key=lambda s: len(s[0]))
    for lo in tqdm(range(0, len(seqs), cfg.gen_batch), desc="capture", unit="batch"):
        ids, prompt_lens = zip(*seqs[lo : lo + cfg.gen_batch])
        captured += capture(model, list(ids), drafter.config.aux_layer_ids, cfg.topk, list(prompt_lens), bf16=bf16)
    samples = [s.tensors() for s in captured if s.loss_mask.sum() >= 2]  # >= 2 tokens to draft
    n_held = max(1, round(cfg.heldout * len(samples)))
    if len(samples) < n_held + 1:
        raise ValueError(f"only {len(samples)} usable generations; give more prompts or a larger --max-new-tokens")
    perm = torch.randperm(len(samples)).tolist()
    held, train = [samples[i] for i in perm[:n_held]], [samples[i] for i in perm[n_held:]]

    def evaluate(row: dict) -> dict:
        row["accept_length"] = acceptance_length(drafter, held, cfg.accept_k)
        row["accept_length_sampled"] = acceptance_length(drafter, held, cfg.accept_k, mode="sampled")
        return row

    history = [evaluate({"step": 0})]
    opt = make_optimizer(drafter, cfg.lr)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1 - 0.9 * min(i / cfg.steps, 1))
    gen = torch.Generator().manual_seed(cfg.seed)
    lengths, queue = [int(s["input_ids"].shape[0]) for s in train], []
    bar = tqdm(range(1, cfg.steps + 1), desc="train drafter", unit="step")
    for step in bar:
        if not queue:  # a new epoch: batches of similar lengths, in random order
            queue = length_batches(lengths, cfg.batch_tokens, cfg.batch_size, gen)
        batch = [train[i] for i in queue.pop()]
        metrics = train_step(drafter, opt, batch, cfg.ttt_length, bf16=bf16)
        decay.step()
        row = {"step": step, "loss": metrics["loss"], "acc_0": metrics["acc_0"]}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            history.append(evaluate(row))
            if checkpoint is not None and step < cfg.steps:
                save_drafter(drafter, checkpoint)
        accept = f"{history[-1]['accept_length']:.2f}"
        bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc_0']:.2f}", accept=accept)
        if log is not None:
            log.write(json.dumps(row) + "\n")
            log.flush()
    return drafter, history


def read_prompts(args: argparse.Namespace) -> list[str]:
    if args.task:
        try:
            from gleanrl.trainer.tasks import load_task
        except ImportError:
            raise ValueError("--task needs gleanrl's trainer.tasks; use --prompts FILE instead") from None
        return [p["prompt"] for p in load_task(args.task).prompts("train", args.num_prompts, args.seed)]
    return prompts_file(args.prompts)[: args.num_prompts]


def prompts_file(name: str) -> list[str]:
    """The prompts of a JSONL file, one {"prompt": exact text} per line; ValueError naming a bad line."""
    path, prompts = Path(name), []
    if not path.is_file():
        raise ValueError(f"prompts file {path} does not exist")
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f'{path}:{n}: each line must be a JSON object with a "prompt"') from None
    return prompts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="target model directory")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help='JSONL file, one {"prompt": exact text} per line')
    src.add_argument("--task", help="a task name for trainer.tasks.load_task (e.g. doubling)")
    parser.add_argument("--out", required=True, help="directory to write the drafter to (atomically)")
    parser.add_argument("--init", default=None, help="start from this drafter instead of a random one")
    parser.add_argument("--layer-ids", default=None, help="aux layer ids a,b,c for a new drafter")
    parser.add_argument("--num-prompts", type=int, default=64, help="prompts whose rollouts train the drafter")
    parser.add_argument("--log", default=None, help="append per-step metrics here as JSONL")
    devices = ["cpu", "cuda"]
    parser.add_argument("--device", choices=devices, default="cpu", help="where generation, capture and training run")
    add_flags(parser, WarmStartConfig)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(WarmStartConfig, args)
        prompts = read_prompts(args)
        if not prompts:
            raise ValueError("no prompts")
        with open(args.log, "a") if args.log else contextlib.nullcontext() as log:
            layer_ids = parse_layer_ids(args.layer_ids)
            drafter, history = warm_start(
                args.model, prompts, cfg, args.init, layer_ids, log, checkpoint=args.out, device=args.device
            )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    save_drafter(drafter, args.out)
    first, last = history[0], history[-1]
    print(
        f"wrote drafter to {args.out}: held-out acceptance length {first['accept_length']:.2f} -> "
        f"{last['accept_length']:.2f} greedy chain, {first['accept_length_sampled']:.2f} -> "
        f"{last['accept_length_sampled']:.2f} expected when sampling (k={cfg.accept_k}, {len(prompts)} prompts, "
        f"{cfg.steps} steps)"
    )
    return 0
