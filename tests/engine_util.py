"""Helpers for the engine tests: run requests through a real Engine and compare with
transformers."""

from __future__ import annotations

import asyncio
import itertools

import torch

from gleanrl.server.http.generate.fanin import Track
from gleanrl.server.protocol import GenerateOutput, GenerateRequest, SamplingParams

_rids = itertools.count()


def req(ids: list[int], **params) -> GenerateRequest:
    params.setdefault("temperature", 0.0)
    return GenerateRequest(
        rid=f"r{next(_rids)}", input_ids=list(ids), params=SamplingParams(**params), return_logprob=True
    )


async def collect(engine, request: GenerateRequest, order: list | None = None) -> dict:
    ids, lps, last = [], [], None
    async for out in engine.generate(request):
        ids += out.new_ids
        lps += out.new_logprobs
        last = out
    if order is not None:
        order.append(request.rid)
    return {"ids": ids, "logprobs": lps, "finish_reason": last.finish_reason, "out": last}


def run_all(engine, requests: list[GenerateRequest], order: list | None = None) -> list[dict]:
    async def main():
        return await asyncio.gather(*[collect(engine, r, order) for r in requests])

    return asyncio.run(main())


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """transformers `generate`, greedy, exactly n new tokens (EOS ignored)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


PROMPTS = [
    "Hello, world!",
    "The quick brown fox",
    "def add(a, b):",
    "Question: what is 12 + 30?",
    "Speculative decoding drafts",
    "print(add(2, 3))",
    "I am fine",
    "Reinforcement learning",
]


def finished_track(ids: list[int], matched: int | str) -> Track:
    """The edge's state of a request that produced `ids` and stopped on `matched` (for
    `server.detok`)."""
    track = Track(GenerateRequest(rid="r", input_ids=[1], params=SamplingParams()))
    track.ids = list(ids)
    track.last = GenerateOutput(
        rid="r", new_ids=[], new_logprobs=[], finished=True, finish_reason={"type": "stop", "matched": matched}
    )
    track.finished_at = 1.0
    return track
