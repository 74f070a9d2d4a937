"""Helpers for the SD engine tests: drafters for the tiny target (random, and quickly trained on the
target's own greedy continuations of the test prompts, so that drafts are often accepted)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from engine_util import PROMPTS
from gleanrl.harvest.capture import capture
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.train_step import make_optimizer, train_step


def random_drafter(model_path: Path, out: Path, seed: int = 0) -> Path:
    return save_drafter(init_drafter(model_path, seed=seed), out)


def trained_drafter(model_path: Path, tokenizer, out: Path, new_tokens: int = 48, steps: int = 80) -> Path:
    """A drafter overfitted (TTT, 4 steps) to the target's greedy continuations of PROMPTS."""
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    with torch.no_grad():
        seqs = [
            model.generate(torch.tensor([p]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)[
                0
            ].tolist()
            for p in prompts
        ]
    drafter = init_drafter(model_path, seed=0)
    samples = capture(model, seqs, drafter.config.aux_layer_ids, topk=None, prompt_lens=[len(p) for p in prompts])
    optimizer = make_optimizer(drafter, lr=3e-3)
    torch.manual_seed(0)
    for _ in range(steps):
        train_step(drafter, optimizer, [s.tensors() for s in samples], length=4)
    return save_drafter(drafter, out)
