"""Batches with a grammar-constrained request are planned, measured and credited by a controller of
their own (`SDDecoder.constrained`, sharing the cost model): what SD does under a grammar leaves the
free requests' estimates as they were, and the other way round."""

from __future__ import annotations

import xgrammar as xgr
from transformers import AutoTokenizer

from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import EngineState
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import SamplingParams
from sd_util import random_drafter, run_seeded, sd_on


def _lane_state(ctl) -> tuple:
    return ctl.accept.version, float(ctl.accept.eagle.tries.sum()), sum(c[0] for c in ctl.cells.cells.values())


def test_constrained_and_free_batches_feed_separate_controllers(tiny_qwen2, tiny_tokenizer, tmp_path):
    runner = ModelRunner.load(str(tiny_qwen2))
    vocab = runner.config.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(tiny_qwen2), vocab_size=vocab)
    compiled = xgr.GrammarCompiler(info).compile_regex("[a-z ]{1,60}")
    spec = sd_on(runner, random_drafter(tiny_qwen2, tmp_path / "drafter"))
    assert spec.constrained is not spec.controller and spec.constrained.cost is spec.controller.cost
    sched, prompt = Scheduler(EngineState(), runner, 4), tiny_tokenizer("The quick brown fox")["input_ids"]
    free, constrained = _lane_state(spec.controller), _lane_state(spec.constrained)

    params = SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True, grammar=compiled)
    run_seeded(sched, spec, prompt, params, 4)
    assert spec.counters.verify_ct > 0
    assert _lane_state(spec.controller) == free  # untouched by the constrained batch
    after = _lane_state(spec.constrained)
    assert all(a > b for a, b in zip(after, constrained))  # acceptance recorded, cells measured

    verified = spec.counters.verify_ct
    run_seeded(sched, spec, prompt, SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True), 4)
    assert spec.counters.verify_ct > verified
    assert _lane_state(spec.constrained) == after
    assert all(a > b for a, b in zip(_lane_state(spec.controller), free))
