"""Lossless SD on CUDA: with a drafter trained on the target's continuations and with a random one,
greedy output is identical to plain decoding on the same device at batch 1 and 4, with drafts
really accepted."""

from __future__ import annotations

import pytest

from engine_util import PROMPTS, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from sd_util import random_drafter, trained_drafter

pytestmark = pytest.mark.cuda
NEW = 40


@pytest.fixture(scope="module")
def drafters(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_drafters")
    return {
        "random": random_drafter(tiny_qwen2, d / "random"),
        "trained": trained_drafter(tiny_qwen2, tiny_tokenizer, d / "trained"),
    }


@pytest.fixture(scope="module")
def engines(tiny_qwen2, drafters, device):
    def make(**kw) -> Engine:
        eng = Engine(
            EngineConfig(model_path=str(tiny_qwen2), device=device, dtype="float32", max_running_requests=16, **kw)
        )
        eng.start()
        return eng

    engs = {"plain": make(sd="off")} | {name: make(drafter=str(p), sd="on") for name, p in drafters.items()}
    yield engs
    for e in engs.values():
        e.shutdown()


@pytest.fixture(scope="module")
def reference(engines):
    prompts = [engines["plain"].tokenizer(p)["input_ids"] for p in PROMPTS[:4]]
    return prompts, run_all(engines["plain"], [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts])


@pytest.mark.parametrize("drafter", ["random", "trained"])
@pytest.mark.parametrize("batch", [1, 4])
def test_sd_greedy_identical_to_plain(engines, reference, drafter, batch):
    prompts, plain = reference
    res = run_all(engines[drafter], [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts[:batch]])
    for r, ref in zip(res, plain):
        assert r["ids"] == ref["ids"]
        assert r["logprobs"] == pytest.approx(ref["logprobs"], abs=1e-3)
        assert r["out"].spec_verify_ct > 0
    if drafter == "trained":  # drafts were accepted, so the accept path is what was compared
        assert sum(r["out"].spec_accept_length for r in res) / batch > 1.8
