"""Supervised fine-tuning from scratch on a task's reference solutions (the bootstrap's training loop).

Examples are bucketed by length into batches of about `batch_tokens` (padding included), so the heavy
tail of long solutions does not pad every batch. Loss is on the response and its end-of-turn token
only. bf16 autocast (on CPU about 2.5x faster than float32 here; on CUDA too); master weights stay float32."""
from __future__ import annotations

import math
import random
from pathlib import Path

import torch


def make_batches(task, tokenizer, size, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(input_ids [B, T], labels [B, T])] covering about `size.train_tokens`, in a seeded order."""
    if not callable(getattr(task, "solution", None)):
        raise ValueError(f"task {task!r} has no solution(sample) method, which the bootstrap needs for SFT")
    examples, total, chunk = [], 0, 0
    while total < size.train_tokens:
        for sample in task.prompts("train", 1000, seed * 1000 + chunk):
            prompt = tokenizer(sample["prompt"], add_special_tokens=False).input_ids
            response = tokenizer(task.solution(sample), add_special_tokens=False).input_ids
            ids = prompt + response + [tokenizer.eos_token_id]
            if len(ids) > size.context:
                raise ValueError(f"a training example has {len(ids)} tokens, over the context of {size.context}")
            examples.append((ids, len(prompt)))
            total += len(ids)
        chunk += 1
    examples.sort(key=lambda e: len(e[0]))
    batches, start = [], 0
    while start < len(examples):
        end = start + 1
        while end < len(examples) and (end + 1 - start) * len(examples[end][0]) <= size.batch_tokens:
            end += 1
        batches.append(_collate(examples[start:end], tokenizer.pad_token_id))
        start = end
    random.Random(seed).shuffle(batches)
    return batches


def _collate(examples: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, n_prompt) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
    return input_ids, labels


def build_model(tokenizer, size, seed: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    # Llama, not Qwen2: transformers 5 loads any qwen2 model's tokenizer as Qwen2Tokenizer (byte-level BPE),
    # which would silently re-tokenize this character-level vocabulary; llama honours tokenizer.json.
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=size.hidden, num_hidden_layers=size.layers,
        num_attention_heads=size.heads, num_key_value_heads=size.kv_heads, intermediate_size=size.intermediate,
        max_position_embeddings=size.context, tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def train_policy(out: Path, task, size, seed: int = 0, progress: bool = True, device: str = "cpu") -> dict:
    """Train a policy for `task` on `device` and save model + tokenizer to `out`; returns training stats."""
    from tqdm import tqdm

    from gleanrl.trainer.tasks.chartok import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    batches = make_batches(task, tokenizer, size, seed)
    model = build_model(tokenizer, size, seed).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=size.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, len(batches) // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min((i + 1) / warmup, 0.1 + 0.9 * 0.5 * (
        1 + math.cos(math.pi * min(1.0, i / len(batches))))))
    bar = tqdm(batches, desc=f"bootstrap {size.hidden}x{size.layers}", unit="step", disable=not progress)
    ema = None
    for input_ids, labels in bar:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=size.bf16):
            loss = model(input_ids=input_ids.to(device), labels=labels.to(device)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.4f}")
    model.eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"parameters": sum(p.numel() for p in model.parameters()), "steps": len(batches),
            "train_tokens": int(sum(b[0].numel() for b in batches)), "final_loss": round(ema or 0.0, 5)}
