"""Supervised fine-tuning from scratch on a task's reference solutions (the bootstrap's training loop).

Examples are bucketed by length into batches of about `batch_tokens` (padding ~0.1 %: packing would buy nothing).
Loss on the response and its end-of-turn token only; bf16 autocast where native (`bf16_fast`), float32 master weights.
`task.solution_focus(sample)` may name character spans carrying the hard step (one token per character); their tokens
weigh `size.focus_weight`. For `doubling`, the first line's counter: 2 tokens of ~40, hardly seen unweighted, and every
error of the old recipe's policy we looked at (docs/task-and-bootstrap.md).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch

from gleanrl.base.batches import length_batches
from gleanrl.harvest.train_step import bf16_fast
from gleanrl.trainer.metrics import mean_se
from gleanrl.trainer.tasks.base import Task


def make_batches(task: Task, tokenizer, size, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """[(input_ids [B, T], labels [B, T], weights [B, T])] over about `size.train_tokens`, seeded order."""
    examples, total, chunk = [], 0, 0
    while total < size.train_tokens:
        for sample in task.prompts("train", 1000, seed * 1000 + chunk):
            if (solution := task.solution(sample)) is None:
                raise ValueError(f"task {task!r} has no solution(sample), which the bootstrap needs for SFT")
            prompt = tokenizer(sample["prompt"], add_special_tokens=False).input_ids
            response = tokenizer(solution, add_special_tokens=False).input_ids
            ids = prompt + response + [tokenizer.eos_token_id]
            if len(ids) > size.context:
                raise ValueError(f"a training example has {len(ids)} tokens, over the context of {size.context}")
            examples.append((ids, len(prompt), _focus(task, sample, len(response))))
            total += len(ids)
        chunk += 1
    rows = length_batches([len(e[0]) for e in examples], max_tokens=size.batch_tokens)
    batches = [_collate([examples[i] for i in r], tokenizer.pad_token_id, size.focus_weight) for r in rows]
    random.Random(seed).shuffle(batches)
    return batches


def _focus(task: Task, sample: dict, n_response: int) -> list[tuple[int, int]]:
    """The task's focus spans of this solution, checked against the response's token count."""
    spans = list(task.solution_focus(sample))
    for lo, hi in spans:
        if not 0 <= lo <= hi <= n_response:
            raise ValueError(f"solution_focus span {(lo, hi)} is outside the solution's {n_response} tokens")
    return spans


def _collate(
    examples: list[tuple[list[int], int, list[tuple[int, int]]]], pad_id: int, focus_weight: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    weights = torch.zeros((len(examples), width), dtype=torch.float32)
    for row, (ids, n_prompt, spans) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
        weights[row, n_prompt : len(ids)] = 1.0
        for lo, hi in spans:
            weights[row, n_prompt + lo : n_prompt + hi] = focus_weight
    return input_ids, labels, weights


def _nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V], labels [B, T] -> [B, T - 1] next-token cross-entropy (0 where the label is -100)."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), labels[:, 1:], ignore_index=-100, reduction="none"
    )


def weighted_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, weighted per label, averaged over the weights (labels -100 weigh 0)."""
    weights = weights[:, 1:] * (labels[:, 1:] != -100)
    return (_nll(logits, labels) * weights).sum() / weights.sum().clamp_min(1e-9)


@torch.no_grad()
def reference_accuracy(
    model, tokenizer, task, samples: list[dict], batch_tokens: int = 4096, per_prompt: bool = False
) -> dict:
    """Accuracy from one teacher-forced forward per reference: `expected` = mean probability of sampling it at
    T = 1, `greedy` = share whose every token is the argmax. Free choices (`solution_choices`) are not scored.
    Where the reference is the only correct response (doubling) `expected` is the T = 1 accuracy without
    sampling noise; else a lower bound. `per_prompt` adds `probs`, `greedy_hits` (samples' order)."""
    was_training = model.training
    model.eval()
    examples = [
        (
            tokenizer(s["prompt"], add_special_tokens=False).input_ids,
            tokenizer(task.solution(s), add_special_tokens=False).input_ids + [tokenizer.eos_token_id],
            task.solution_choices(s),
        )
        for s in samples
    ]
    probs, greedy = [0.0] * len(examples), [0.0] * len(examples)
    device = next(model.parameters()).device
    for rows in length_batches([len(p) + len(r) for p, r, _ in examples], max_tokens=batch_tokens):
        batch = [(p + r, len(p), c) for p, r, c in (examples[i] for i in rows)]
        # right padding: never attended; the task's free choices weigh 0 (not scored)
        input_ids, labels, weights = _collate(batch, tokenizer.pad_token_id or 0, focus_weight=0.0)
        labels, weights = labels.to(device), weights[:, 1:].to(device)
        logits = model(input_ids=input_ids.to(device)).logits
        nll = _nll(logits, labels) * weights
        hit = (logits[:, :-1].argmax(-1) == labels[:, 1:]) | (weights == 0)
        for row, i in enumerate(rows):
            probs[i] = math.exp(-nll[row].sum().item())
            greedy[i] = float(hit[row].all().item())
    model.train(was_training)
    mean, se = mean_se(probs)
    greedy_share = sum(greedy) / max(1, len(samples))
    out = {"expected": round(mean, 4), "expected_se": round(se, 4), "greedy": round(greedy_share, 4), "n": len(samples)}
    return out | ({"probs": probs, "greedy_hits": greedy} if per_prompt else {})


def lr_factor(step: int, total: int, warmup: float = 0.05, final: float = 0.1) -> float:
    """Linear warmup over the first `warmup` of the steps, under a cosine from 1 to `final` at `total`
    (defaults: the version-1 recipe's schedule)."""
    n_warm = max(1, int(total * warmup))
    return min((step + 1) / n_warm, final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))


def build_model(tokenizer, size, seed: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    # Llama, not Qwen2: transformers 5 loads a qwen2 model's tokenizer as byte-level BPE, silently
    # re-tokenizing this character vocabulary; llama honours tokenizer.json.
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        intermediate_size=size.intermediate,
        max_position_embeddings=size.context,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def train_policy(out: Path, task: Task, size, seed: int = 0, progress: bool = True, device: str = "cpu") -> dict:
    """Train a policy for `task` on `device`, save model + tokenizer to `out`; returns training stats."""
    from gleanrl.trainer.tasks.builtin import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    batches = make_batches(task, tokenizer, size, seed)
    model = build_model(tokenizer, size, seed).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=size.lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: lr_factor(i, len(batches), size.warmup, size.final_lr))
    ema, curve = _fit(
        model, opt, sched, batches, size, device, desc=f"bootstrap {size.hidden}x{size.layers}", progress=progress
    )
    if size.polish_steps:
        model, polish = polish_policy(model, task, tokenizer, size, seed, device, progress)
        curve += [[len(batches) + step, loss] for step, loss in polish]
        ema = polish[-1][1] if polish else ema
    model.eval()
    # the demo's held-out prompts (test split, seed 0, 192): reported, never trained or tuned on
    heldout = reference_accuracy(model, tokenizer, task, task.prompts("test", 192, 0), size.batch_tokens)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": len(batches) + size.polish_steps,
        "train_tokens": int(sum(b[0].numel() for b in batches)),
        "final_loss": round(ema or 0.0, 5),
        "heldout_reference_accuracy": heldout,
        "loss_curve": curve,
    }


def _fit(model, opt, sched, batches, size, device: str, desc: str, progress: bool) -> tuple[float | None, list[list]]:
    """One pass of weighted-loss SFT over `batches`; -> (the loss's EMA, [[step, ema], ...])."""
    from tqdm import tqdm

    bar = tqdm(batches, desc=desc, unit="step", disable=not progress)
    ema, curve = None, []
    bf16 = size.bf16 and bf16_fast(device)
    for step, (input_ids, labels, weights) in enumerate(bar):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=input_ids.to(device)).logits
        loss = weighted_loss(logits, labels.to(device), weights.to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.4f}")
        if (step + 1) % 25 == 0:
            curve.append([step + 1, round(ema, 5)])
    return ema, curve


def polish_policy(model, task: Task, tokenizer, size, seed: int, device: str = "cpu", progress: bool = True):
    """The recipe's last phase: `size.polish_steps` steps on fresh problems at the final lr, focus tokens weighted
    `size.polish_focus_weight`. The last errors sit on the focus tokens the main loss hardly sees; weighting them
    after the rule is learned avoids the unstable start a weighted loss from scratch had (`small_fast`,
    docs/task-and-bootstrap.md). -> (the model, [[step, ema], ...])."""
    import dataclasses

    polish = dataclasses.replace(
        size, focus_weight=size.polish_focus_weight, train_tokens=size.polish_steps * size.batch_tokens
    )
    batches = make_batches(task, tokenizer, polish, seed + 1)[: size.polish_steps]
    lr = size.lr * size.final_lr
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    model.train()
    desc = f"polish (focus x{size.polish_focus_weight:g})"
    _, curve = _fit(model, opt, sched, batches, polish, device, desc=desc, progress=progress)
    return model, curve
