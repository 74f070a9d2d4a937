"""Helpers for the SD engine tests: drafters for the tiny target (random, and quickly trained on the
target's own greedy continuations of the test prompts, so that drafts are often accepted); seeded
requests and the sampling tests' decoder."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from engine_util import PROMPTS
from gleanrl.harvest.capture import capture
from gleanrl.harvest.checkpoint import load_drafter, save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.train_step import make_optimizer, train_step
from gleanrl.server.config import ControllerConfig
from gleanrl.server.decode.sd_decoder import SDDecoder
from gleanrl.server.protocol import GenerateRequest, SamplingParams
from gleanrl.server.sampling.sequence import Sequence, StopChecker
from gleanrl.server.sd.controller import Controller


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


def seeded(prompt: list[int], params: SamplingParams, ids: range) -> list[Sequence]:
    """Requests r{i} of `prompt` for i in `ids`, each with its own generator seeded i."""
    return [
        Sequence(
            GenerateRequest(f"r{i}", prompt, params),
            lambda out: None,
            StopChecker(params, set(), 1024),
            torch.Generator().manual_seed(i),
        )
        for i in ids
    ]


def sd_on(runner, drafter: Path) -> SDDecoder:
    """SD on, EAGLE-3 chains of 3 from `drafter`."""
    spec = SDDecoder(Controller(ControllerConfig(sd="on", num_draft_tokens=3)))
    spec.set_drafter(load_drafter(drafter, embed_tokens=runner.embed.weight), "d")
    return spec


def run_seeded(sched, spec, prompt: list[int], params: SamplingParams, n: int, on_done=None) -> list[list[int]]:
    """n seeded requests through `sched` (a Scheduler), as many at once as it runs; their outputs.
    on_done(seqs): called with each step's finished sequences."""
    outputs = []
    for lo in range(0, n, sched.max_running):
        sched.state.waiting.extend(seeded(prompt, params, range(lo, lo + sched.max_running)))
        sched.admit()
        while sched.state.running:
            done = sched.step(spec)
            outputs += [s.output_ids for s in done]
            if on_done is not None:
                on_done(done)
            sched.reap(done)
    return outputs
