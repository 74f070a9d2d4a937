"""Sampled SD under a grammar's mask follows plain decoding under the same mask (issue 32): the
sampled-SD chi-square of `test_sd_engine_sampling.py` with a regex grammar (xgrammar) on every
request. The exact marginals of tokens 2 and 3 are sums over the target's masked, processed
distributions of every allowed prefix (the mask read from an xgrammar matcher driven by hand), and
SD must both accept drafts and meet drafts the grammar forbids (rejected with certainty)."""

from __future__ import annotations

from collections import Counter

import torch
import xgrammar as xgr
from transformers import AutoModelForCausalLM, AutoTokenizer

from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import EngineState
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import SamplingParams
from gleanrl.server.sampling.grammar import _unpack
from gleanrl.server.sampling.sampler import processed_probs
from sd_util import run_seeded, sd_on, trained_drafter
from test_sd_engine_sampling import _chi2

N, BATCH, TOP_K = 3000, 100, 8
REGEX = "[a-z ]{1,60}"


def _masked_probs(model, matcher, ids: list[int], vocab: int) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1:].float()
    bits = xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(bits)
    logits = logits.masked_fill(~_unpack(bits, vocab), float("-inf"))
    one = torch.ones(1)
    return processed_probs(logits, one, torch.tensor([TOP_K]), one, torch.zeros(1))[0]


def _marginals(model, compiled, prompt: list[int], vocab: int):
    m = xgr.GrammarMatcher(compiled)
    p1 = _masked_probs(model, m, prompt, vocab)
    m2: Counter = Counter()
    m3: Counter = Counter()
    for t1 in p1.nonzero()[:, 0].tolist():
        assert m.accept_token(t1)
        p2 = _masked_probs(model, m, prompt + [t1], vocab)
        for t2 in p2.nonzero()[:, 0].tolist():
            w = float(p1[t1] * p2[t2])
            m2[t2] += w
            assert m.accept_token(t2)
            for t3, q in enumerate(_masked_probs(model, m, prompt + [t1, t2], vocab).tolist()):
                if q > 0:
                    m3[t3] += w * q
            m.rollback(1)
        m.rollback(1)
    return m2, m3


def test_sampled_sd_with_a_grammar_follows_plain_with_the_mask(tiny_qwen2, tiny_tokenizer, tmp_path):
    runner = ModelRunner.load(str(tiny_qwen2))
    vocab = runner.config.vocab_size
    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)).compile_regex(REGEX)
    drafter = trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path / "drafter")
    spec = sd_on(runner, drafter)
    prompt = tiny_tokenizer("The quick brown fox")["input_ids"]
    params = SamplingParams(max_new_tokens=4, temperature=1.0, top_k=TOP_K, ignore_eos=True, grammar=compiled)
    counts = [0, 0]  # draft tokens proposed, accepted

    def count(done) -> None:
        counts[0] += sum(s.spec_draft_token_num for s in done)
        counts[1] += sum(s.spec_accept_token_num for s in done)

    outputs = run_seeded(Scheduler(EngineState(), runner, BATCH), spec, prompt, params, N, count)
    proposed, accepted = counts
    assert len(outputs) == N and all(len(o) == 4 for o in outputs)
    assert spec.counters.verify_ct > 0 and 0 < accepted < proposed  # accepts and rejections
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    m2, m3 = _marginals(model, compiled, prompt, vocab)
    for pos, exact in ((1, m2), (2, m3)):
        stat, threshold = _chi2(Counter(o[pos] for o in outputs), exact, N)
        assert stat < threshold, f"token {pos + 1}: chi-square {stat:.1f} >= {threshold:.1f}"
