"""Sampled SD with group drafts through the real decoder follows the target's distribution.

Many siblings of one prompt are in flight (batches of 100, T = 1, top-k 8), and every finished
batch's samples stay in the group index, so the later batches verify majority continuations of their
siblings as point-mass drafts (arm `group`) or together with a trained EAGLE-3 chain as a two-branch
tree (arm `fused`). Token 1 comes from prefill; tokens 2 and 3 come from verify passes. Their exact
marginals are computed with transformers; Pearson's chi-square against them (cells of expected count
< 5 pooled) must stay under its 1 - 1e-6 quantile. The negative control breaks the point-mass
rejection rule (a rejected draft token stays in the residual) and the same statistic must reject it.
"""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from gleanrl.server.config import ControllerConfig
from gleanrl.server.decode.sd_decoder import SDDecoder
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import SamplingParams
from gleanrl.server.sd import branch_verify
from gleanrl.server.sd.controller import Controller
from gleanrl.server.sd.group_index import GroupDrafts
from sd_util import seeded, trained_drafter
from test_sd_engine_sampling import TOP_K, _chi2, _marginals

BATCH, NEW = 100, 4


@pytest.fixture(scope="module")
def setup(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    drafter = trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path_factory.mktemp("gdist") / "drafter")
    prompt = tiny_tokenizer("The quick brown fox")["input_ids"]
    exact = _marginals(AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval(), prompt)
    return ModelRunner.load(str(tiny_qwen2)), drafter, prompt, exact


def _decoder(runner, drafter, arm: str) -> SDDecoder:
    """arm group: group drafts of up to 3 tokens; fused: an EAGLE-3 chain of 2 and a group
    branch of up to 2."""
    from gleanrl.harvest.checkpoint import load_drafter

    fused = arm == "fused"
    ctl = Controller(
        ControllerConfig(
            sd="on", sd_sources=("eagle", "group", "fused") if fused else ("group",), num_draft_tokens=2 if fused else 3
        )
    )
    dec = SDDecoder(ctl, GroupDrafts())
    if arm == "fused":
        dec.set_drafter(load_drafter(drafter, embed_tokens=runner.embed.weight), "d")
    return dec


def _sample(runner, dec: SDDecoder, prompt: list[int], n: int) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=NEW, temperature=1.0, top_k=TOP_K, ignore_eos=True)
    outputs = []
    for lo in range(0, n, BATCH):
        seqs = seeded(prompt, params, range(lo, lo + BATCH))
        for s in seqs:
            s.cache = runner.new_cache()
        while seqs:
            for s, (ids, _) in zip(seqs, dec.decode(runner, seqs)):
                for t in ids:
                    s.output_ids.append(t)
                    if s.stopper.check(s.output_ids, s.total_len):
                        break
            outputs += [s.output_ids for s in seqs if len(s.output_ids) >= NEW]
            seqs = [s for s in seqs if len(s.output_ids) < NEW]
    return outputs


def _stats(outputs, exact) -> list[tuple[float, float]]:
    from collections import Counter

    return [_chi2(Counter(o[pos] for o in outputs), m, len(outputs)) for pos, m in ((1, exact[0]), (2, exact[1]))]


@pytest.mark.parametrize("arm", ["group", "fused"])
def test_sampled_group_drafts_follow_the_target(setup, arm):
    runner, drafter, prompt, exact = setup
    dec = _decoder(runner, drafter, arm)
    outputs = _sample(runner, dec, prompt, 4000)
    assert len(outputs) == 4000 and all(len(o) == NEW for o in outputs)
    accepted = dec.counters.spec_accept_token_num_by_source
    assert accepted["group"] > 500, "group drafts were rarely accepted: the test would be weak"
    if arm == "fused":
        assert accepted["eagle"] > 500, "the EAGLE-3 branch was rarely accepted"
    for pos, (stat, threshold) in zip((2, 3), _stats(outputs, exact)):
        assert stat < threshold, f"token {pos}: chi-square {stat:.1f} >= {threshold:.1f}"


def test_broken_rejection_rule_is_detected(setup, monkeypatch):
    original = branch_verify._test

    def keep_rejected_token(r, x, q, u, on):
        accepted, rest = original(r, x, q, u, on)
        return accepted, r if q is None else rest

    monkeypatch.setattr(branch_verify, "_test", keep_rejected_token)
    runner, drafter, prompt, exact = setup
    outputs = _sample(runner, _decoder(runner, drafter, "group"), prompt, 4000)
    assert any(stat > threshold for stat, threshold in _stats(outputs, exact)), "no power against a broken rule"
