"""The embedded engine on CUDA against transformers on CUDA: greedy identity in float32 for each
architecture, solo and in a batch of mixed lengths (requests joining and leaving), and a bfloat16
engine that serves what it is asked for (bf16 kernels may break near-ties differently, so not
token for token)."""

from __future__ import annotations

import math

import pytest
import torch

from cuda_util import hf_greedy, hf_on
from engine_util import PROMPTS, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine

pytestmark = pytest.mark.cuda


def _engine(path, device: str, **kw) -> Engine:
    eng = Engine(EngineConfig(model_path=str(path), device=device, max_running_requests=32, **kw))
    eng.start()
    return eng


@pytest.mark.parametrize("arch", ["tiny_qwen2", "tiny_llama", "tiny_qwen3"])
def test_greedy_equals_transformers(arch, device, request):
    path = request.getfixturevalue(arch)
    eng = _engine(path, device, dtype="float32")
    try:
        assert eng.info()["device"] == device
        prompts = [eng.tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
        res = run_all(eng, [req(p, max_new_tokens=24, ignore_eos=True) for p in prompts])
    finally:
        eng.shutdown()
    model = hf_on(path, device)
    for p, r in zip(prompts, res):
        assert r["ids"] == hf_greedy(model, p, 24)
        assert r["finish_reason"] == {"type": "length", "length": 24}


def test_mixed_lengths_batch_each_equals_transformers(tiny_qwen2, device):
    eng = _engine(tiny_qwen2, device, dtype="float32")
    lengths = [3, 40, 10, 30, 5, 48, 20, 8]
    try:
        prompts = [eng.tokenizer(PROMPTS[i] * (1 + i % 3))["input_ids"] for i in range(len(lengths))]
        res = run_all(eng, [req(p, max_new_tokens=n, ignore_eos=True) for p, n in zip(prompts, lengths)])
    finally:
        eng.shutdown()
    model = hf_on(tiny_qwen2, device)
    for p, n, r in zip(prompts, lengths, res):
        assert r["ids"] == hf_greedy(model, p, n)


def test_bfloat16_serves_requested_lengths(tiny_qwen2, device):
    eng = _engine(tiny_qwen2, device, dtype="bfloat16")
    try:
        assert eng.scheduler.runner.dtype == torch.bfloat16
        prompts = [eng.tokenizer(p)["input_ids"] for p in PROMPTS[:4]]
        res = run_all(eng, [req(p, max_new_tokens=16, ignore_eos=True) for p in prompts])
    finally:
        eng.shutdown()
    for r in res:
        assert len(r["ids"]) == 16 and len(r["logprobs"]) == 16
        assert all(math.isfinite(lp) and lp <= 0 for lp in r["logprobs"])
