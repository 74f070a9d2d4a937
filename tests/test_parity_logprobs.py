"""SGLang's logprob options over HTTP (issue 13, item 4): input logprobs with logprob_start_len
(slime's on-policy distillation sends max_new_tokens 0), top_logprobs_num, token_ids_logprob and
return_text_in_logprobs, checked against transformers."""

from __future__ import annotations

import httpx
import pytest
import torch

from serving import running_app


@pytest.fixture(scope="module", params=[False, True], ids=["embedded", "engine_process"])
def url(tiny_qwen2, request):
    with running_app(tiny_qwen2, max_running_requests=4, engine_process=request.param) as (u, _app):
        yield u


def gen(url, body):
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: row i is log p(. | ids[:i + 1])."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


@pytest.mark.parametrize("start", [0, 3])
def test_input_logprobs_with_no_new_tokens(url, hf, tok, start):
    ids = tok.encode("Question: what is 12 + 30? Answer: 42")
    out = gen(
        url,
        {
            "input_ids": ids,
            "return_logprob": True,
            "logprob_start_len": start,
            "top_logprobs_num": 2,
            "token_ids_logprob": [5, 9],
            "sampling_params": {"max_new_tokens": 0},
        },
    )
    meta, ref = out["meta_info"], hf_logprobs(hf, ids)
    assert out["output_ids"] == [] and meta["output_token_logprobs"] == []
    got = meta["input_token_logprobs"]
    # SGLang: the first entry is None
    assert [t for _, t, _ in got] == ids[start:] and got[0][0] is None
    want = ref[start:-1].gather(1, torch.tensor(ids[start + 1 :])[:, None])[:, 0]
    assert torch.allclose(torch.tensor([lp for lp, _, _ in got[1:]]), want, atol=1e-4)
    tops = meta["input_top_logprobs"]
    assert len(tops) == len(ids) - start and tops[0] is None
    for row, dist in zip(tops[1:], ref[start:-1]):
        vals, idx = dist.topk(2)
        assert [t for _, t, _ in row] == idx.tolist() and torch.allclose(torch.tensor([v for v, _, _ in row]), vals)
    picked = meta["input_token_ids_logprobs"]
    assert picked[0] is None and [[t for _, t, _ in r] for r in picked[1:]] == [[5, 9]] * (len(ids) - start - 1)
    assert torch.allclose(torch.tensor([[v for v, _, _ in r] for r in picked[1:]]), ref[start:-1][:, [5, 9]], atol=1e-4)


def test_output_top_and_token_id_logprobs_with_text(url, hf, tok):
    ids = tok.encode("The quick brown fox")
    out = gen(
        url,
        {
            "input_ids": ids,
            "return_logprob": True,
            "top_logprobs_num": 3,
            "token_ids_logprob": [7],
            "return_text_in_logprobs": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
        },
    )
    meta, new = out["meta_info"], out["output_ids"]
    ref = hf_logprobs(hf, ids + new)[len(ids) - 1 : -1]  # [6, V]
    # default start: output only
    assert meta["input_token_logprobs"] == []
    tops, picked = meta["output_top_logprobs"], meta["output_token_ids_logprobs"]
    assert len(tops) == len(picked) == 6 == meta["output_token_logprobs_length"]
    for k, (lp, t, text) in enumerate(meta["output_token_logprobs"]):
        assert t == new[k] and text == tok.decode([t]) and abs(lp - ref[k, t]) < 1e-4
        assert tops[k][0][1] == t and len(tops[k]) == 3 and tops[k][1][2] == tok.decode([tops[k][1][1]])
        assert picked[k][0][1] == 7 and abs(picked[k][0][0] - ref[k, 7]) < 1e-4


def test_sampled_top_logprobs_use_the_temperature(url, hf, tok):
    ids = tok.encode("Hello")
    out = gen(
        url,
        {
            "input_ids": ids,
            "return_logprob": True,
            "top_logprobs_num": 1,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.5, "sampling_seed": 3},
        },
    )
    with torch.no_grad():
        dist = torch.log_softmax(hf(torch.tensor([ids])).logits[0, -1] / 0.5, -1)
    ((lp, t, text),) = out["meta_info"]["output_top_logprobs"][0]
    assert t == int(dist.argmax()) and abs(lp - float(dist.max())) < 1e-4 and text is None
