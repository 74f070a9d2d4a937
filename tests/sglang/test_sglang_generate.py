"""The trainer's client against a real SGLang server: /generate with input_ids, return_logprob and
sampling params; greedy output and logprobs agree with the embedded server on the same model.

Tolerance: greedy tokens must be identical; logprobs within 2e-4 absolute. Both servers run the
model in float32 (SGLang with `--dtype float32`, which gleanrl's launcher passes on CPU) but with
different kernels (SGLang's torch_native attention, fused qkv/gate_up projections) so the sums are
taken in a different order: float32 rounding then moves a logprob of magnitude ~5 by ~1e-6..1e-5.
2e-4 leaves margin for that and is still far below what a real disagreement produces (a temperature
or top-p convention error, a bf16/fp16 run or another model moves logprobs by 1e-2 or more).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

pytestmark = pytest.mark.sglang
ATOL = 2e-4
PROMPTS = [
    "<|im_start|>user\ndouble 7 times, keep 3 digits: 705<|im_end|>\n<|im_start|>assistant\n",
    "12+30=",
    "The quick brown fox",
]


def _client_generate(url: str, ids: list[list[int]], params: dict) -> list[dict]:
    from gleanrl.clients.rollout_client import RolloutClient

    async def go():
        async with RolloutClient([url]) as client:
            return await asyncio.gather(*(client.generate(i, params, return_logprob=True) for i in ids))

    return asyncio.run(go())


def _check_shape(out: dict, prompt_len: int, max_new: int) -> None:
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == prompt_len and meta["completion_tokens"] == len(out["output_ids"]) <= max_new
    assert meta["finish_reason"]["type"] in ("stop", "length") and meta["weight_version"] == "default"
    lps = meta["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out["output_ids"] and all(lp <= 0 for lp, _, _ in lps)


def test_greedy_output_and_logprobs_match_the_embedded_server(sglang_server, sglang_tokenizer):
    from serving import running_server

    ids = [sglang_tokenizer.encode(p) for p in PROMPTS]
    params = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    ours = _client_generate(sglang_server.url, ids, params)
    with running_server(sglang_server.model) as url:
        embedded = _client_generate(url, ids, params)
    worst = 0.0
    for prompt, a, b in zip(ids, ours, embedded):
        _check_shape(a, len(prompt), 16)
        assert a["output_ids"] == b["output_ids"] and len(a["output_ids"]) == 16
        la = torch.tensor([lp for lp, _, _ in a["meta_info"]["output_token_logprobs"]])
        lb = torch.tensor([lp for lp, _, _ in b["meta_info"]["output_token_logprobs"]])
        worst = max(worst, (la - lb).abs().max().item())
    print(f"\n[sglang] greedy: identical tokens, max |logprob diff| vs embedded = {worst:.2e}")
    assert worst < ATOL


def _sampled(sglang_server, tokenizer, T: float, top_p: float):
    """SGLang's sampled output + the same tokens scored by transformers in float32: (theirs,
    logits, ids)."""
    from transformers import AutoModelForCausalLM

    prompt = tokenizer.encode(PROMPTS[0])
    out = _client_generate(
        sglang_server.url,
        [prompt],
        {"max_new_tokens": 16, "temperature": T, "top_p": top_p, "ignore_eos": True, "sampling_seed": 7},
    )[0]
    _check_shape(out, len(prompt), 16)
    model = AutoModelForCausalLM.from_pretrained(sglang_server.model, dtype=torch.float32).eval()
    with torch.no_grad():
        # [16, V]
        logits = model(torch.tensor([prompt + out["output_ids"]])).logits[0, len(prompt) - 1 : -1]
    theirs = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
    return theirs, logits, torch.tensor(out["output_ids"])


def test_sampled_logprobs_are_temperature_scaled_not_top_p_renormalised(sglang_server, sglang_tokenizer):
    """Measured SGLang 0.5.23 convention (srt/layers/sampler.py: `torch.log(probs)` of
    softmax(logits / T), taken before top-k/top-p/min-p filter a copy): log_softmax(logits / T) at
    the sampled token."""
    T = 0.7
    theirs, logits, ids = _sampled(sglang_server, sglang_tokenizer, T, top_p=0.9)
    scaled = torch.log_softmax(logits / T, -1).gather(-1, ids[:, None])[:, 0]
    raw = torch.log_softmax(logits, -1).gather(-1, ids[:, None])[:, 0]
    print(
        f"\n[sglang] sampled T={T} top_p=0.9: max |diff| vs log_softmax(logits/T) "
        f"{(theirs - scaled).abs().max():.2e}, vs raw "
        f"log_softmax {(theirs - raw).abs().max():.2e}"
    )
    assert (theirs - scaled).abs().max() < ATOL
    assert (theirs - raw).abs().max() > 10 * ATOL  # the test can tell the conventions apart


@pytest.mark.parametrize("T,top_p", [(0.7, 1.0), (1.5, 0.5)])
def test_trainer_convention_matches_sglang(sglang_server, sglang_tokenizer, T, top_p):
    """server/sampling/sampler.py's token_logprobs (used by the embedded server and the trainer)
    equals SGLang's logprob, including with a small top-p nucleus, which an older SGLang
    renormalised over."""
    from gleanrl.server.sampling.sampler import token_logprobs

    theirs, logits, ids = _sampled(sglang_server, sglang_tokenizer, T, top_p)
    n = len(ids)
    ours = token_logprobs(logits, ids, torch.full((n,), T))
    assert (theirs - ours).abs().max() < ATOL
    # the nucleus-renormalised value would differ: the test can tell the conventions apart
    if top_p < 1:
        probs = torch.softmax(logits / T, -1)
        sorted_p = probs.sort(-1, descending=True).values
        # [16] nucleus mass
        mass = (sorted_p * ((sorted_p.cumsum(-1) - sorted_p) <= top_p)).sum(-1)
        assert (-mass.log()).max() > 10 * ATOL
