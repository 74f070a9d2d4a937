"""SGLang's sampling parameters beyond temperature/top-k/top-p/min-p (issue 13, item 3): the
penalties, min_new_tokens and logit_bias as pure functions against a plain-Python reading of
SGLang's penaltylib, then over HTTP against a greedy reference loop on transformers; stop_regex,
custom_params, and max_new_tokens limited by the context only."""

from __future__ import annotations

import re

import httpx
import pytest
import torch

from gleanrl.server.protocol import SamplingParams
from gleanrl.server.sampling.sampler import penalise_rows, window_counts
from serving import running_app


def reference_penalties(logits: list[float], output: list[int], p: SamplingParams, stop_ids: set[int]) -> list[float]:
    """SGLang 0.5.23 penaltylib, one row, read token by token: additive, then scaling,
    then logit_bias."""
    out = list(logits)
    for t in range(len(out)):
        c = output.count(t)
        out[t] -= p.frequency_penalty * c + (p.presence_penalty if c else 0.0)
        if t in stop_ids and len(output) < p.min_new_tokens:
            out[t] = float("-inf")
        if c:
            out[t] = out[t] * p.repetition_penalty if out[t] < 0 else out[t] / p.repetition_penalty
        out[t] += p.logit_bias.get(t, 0.0)
    return out


def test_penalise_rows_matches_the_reference():
    torch.manual_seed(0)
    vocab, outputs = 12, [[1, 1, 3], [], [5, 2, 5, 5, 0]]
    params = [
        SamplingParams(frequency_penalty=0.7, presence_penalty=-0.3, repetition_penalty=1.3, min_new_tokens=5),
        SamplingParams(logit_bias={4: 2.5, 7: -1.0}, min_new_tokens=1),
        SamplingParams(repetition_penalty=0.6, presence_penalty=1.1, logit_bias={5: 0.5}),
    ]
    stops = [{2, 3}, {4}, {0}]
    logits = torch.randn(3, vocab) * 3
    counts = [torch.bincount(torch.tensor(o, dtype=torch.long), minlength=vocab).float() for o in outputs]
    got = penalise_rows(logits, params, counts, [len(o) for o in outputs], stops)
    want = torch.tensor([reference_penalties(logits[i].tolist(), outputs[i], params[i], stops[i]) for i in range(3)])
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.isinf(got).any()
    finite = ~torch.isinf(want)
    assert torch.allclose(got[finite], want[finite], atol=1e-5)


def test_window_counts_count_the_drafts_before_each_position():
    counts = torch.tensor([1.0, 0, 2, 0])
    rows = window_counts(counts, [1, 1, 3])
    assert rows.tolist() == [[1, 0, 2, 0], [1, 1, 2, 0], [1, 2, 2, 0], [1, 2, 2, 1]]


@pytest.fixture(scope="module")
def url(tiny_qwen2):
    with running_app(tiny_qwen2, max_running_requests=4, context_length=40000) as (u, _app):
        yield u


def gen(url, body):
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def hf_greedy_penalised(hf, ids: list[int], n: int, p: SamplingParams, stop_ids: set[int]) -> list[int]:
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = hf(torch.tensor([ids + out])).logits[0, -1].tolist()
            row = reference_penalties(logits, out, p, stop_ids)
            out.append(max(range(len(row)), key=row.__getitem__))
    return out


@pytest.mark.parametrize(
    "extra",
    [
        {"repetition_penalty": 1.8},
        {"frequency_penalty": 1.5, "presence_penalty": 0.5},
        {"presence_penalty": -1.0, "repetition_penalty": 0.7},
    ],
)
def test_greedy_with_penalties_matches_the_reference_loop(url, hf, tok, extra):
    ids = tok.encode("The quick brown fox")
    plain = gen(
        url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}
    )["output_ids"]
    out = gen(
        url,
        {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}},
    )["output_ids"]
    assert out == hf_greedy_penalised(hf, ids, 12, SamplingParams(**extra), set())
    assert out != plain  # the penalty changed something, so the test can fail


def test_logit_bias_and_min_new_tokens(url, tok):
    ids, forced = tok.encode("Hello"), 77
    out = gen(
        url,
        {
            "input_ids": ids,
            "sampling_params": {
                "max_new_tokens": 6,
                "temperature": 0,
                "ignore_eos": True,
                "logit_bias": {str(forced): 100.0},
            },
        },
    )
    assert out["output_ids"] == [forced] * 6
    # the biased token is a stop id: masked until min_new_tokens tokens exist, then it
    # ends the request
    out = gen(
        url,
        {
            "input_ids": ids,
            "sampling_params": {
                "max_new_tokens": 20,
                "temperature": 0.8,
                "min_new_tokens": 5,
                "stop_token_ids": [forced],
                "logit_bias": {str(forced): 100.0},
            },
        },
    )
    assert len(out["output_ids"]) == 6 and out["output_ids"][-1] == forced and forced not in out["output_ids"][:5]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": forced}


def test_stop_regex_ends_at_the_first_match(url, tok):
    ids = tok.encode("def add(a, b):")
    sp = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    full = gen(url, {"input_ids": ids, "sampling_params": sp})
    text = full["text"]
    pattern = re.escape(text[6:9]) + "."
    out = gen(url, {"input_ids": ids, "sampling_params": {**sp, "stop_regex": [pattern]}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    n = len(out["output_ids"])
    assert n < 24 and out["output_ids"] == full["output_ids"][:n]
    assert re.search(pattern, tok.decode(out["output_ids"]))
    assert not re.search(pattern, tok.decode(out["output_ids"][:-1]))


def test_custom_params_and_long_max_new_tokens_are_accepted(url, tok):
    forced = 77
    out = gen(
        url,
        {
            "text": "hi",
            "sampling_params": {
                "custom_params": {},
                "max_new_tokens": 20000,
                "temperature": 0,
                "stop_token_ids": [forced],
                "logit_bias": {str(forced): 100.0},
            },
        },
    )
    assert out["output_ids"] == [forced]
    r = httpx.post(f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 40000}}, timeout=60)
    assert r.status_code == 400 and "maximum context length of 40000 tokens" in r.json()["error"]["message"]
