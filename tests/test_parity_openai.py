"""OpenAI parity with SGLang (issue 13, items 3, 4, 7, 9) through the official `openai` client:
`model` omitted or "default", completions logprobs=k with echo (prompt logprobs), chat
top_logprobs=k (also streamed), penalties and logit_bias passed through, unimplemented fields
refused by name, and an explicit max_tokens beyond the context refused."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from engine_util import hf_greedy
from serving import running_server


@pytest.fixture(scope="module")
def url(tiny_qwen2):
    with running_server(tiny_qwen2, context_length=256) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def test_model_omitted_or_default(url, client):
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert client.completions.create(model="default", prompt="hi", max_tokens=2).choices[0].text is not None
    # a client's own model name is served and echoed (SGLang); only /v1/models/{name} 404s
    assert client.completions.create(model="gpt-4o-mini", prompt="hi", max_tokens=2).model == "gpt-4o-mini"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o-mini")


def test_completion_top_logprobs_and_echo(client, hf, tok):
    prompt = "The quick brown fox"
    ids = tok.encode(prompt)
    out = client.completions.create(model="default", prompt=prompt, max_tokens=5, logprobs=3, echo=True, **GREEDY)
    lp = out.choices[0].logprobs
    assert out.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) + 5
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    with torch.no_grad():
        full = ids + hf_greedy(hf, ids, 5)
        ref = torch.log_softmax(hf(torch.tensor([full])).logits[0], -1)
    want = ref[:-1].gather(1, torch.tensor(full[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), want, atol=1e-4)
    for row, dist in zip(lp.top_logprobs[1:], ref[:-1]):
        assert len(row) == 3 and abs(max(row.values()) - float(dist.max())) < 1e-4
    chunks = list(
        client.completions.create(
            model="default", prompt=prompt, max_tokens=5, logprobs=1, echo=True, stream=True, **GREEDY
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and torch.allclose(torch.tensor(streamed[1:]), torch.tensor(lp.token_logprobs[1:]))


def test_chat_top_logprobs_plain_and_streamed(client):
    msgs = [{"role": "user", "content": "Say something"}]
    out = client.chat.completions.create(
        model="default", messages=msgs, max_tokens=4, logprobs=True, top_logprobs=2, **GREEDY
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    for c in content:
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token
        assert abs(c.top_logprobs[0].logprob - c.logprob) < 1e-5
    streamed = [
        c
        for chunk in client.chat.completions.create(
            model="default", messages=msgs, max_tokens=4, logprobs=True, top_logprobs=2, stream=True, **GREEDY
        )
        for ch in chunk.choices
        if ch.logprobs
        for c in ch.logprobs.content
    ]
    assert [(c.token, round(c.logprob, 4)) for c in streamed] == [(c.token, round(c.logprob, 4)) for c in content]


def test_penalties_and_logit_bias_pass_through(client, tok):
    out = client.completions.create(model="default", prompt="hi", max_tokens=4, logit_bias={"77": 100}, **GREEDY)
    assert out.choices[0].text == tok.decode([77] * 4)
    out = client.completions.create(
        model="default",
        prompt="hi",
        max_tokens=4,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        temperature=0,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.2, "min_tokens": 2},
    )
    assert out.usage.completion_tokens == 4


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"extra_body": {"functions": [{"name": "f"}]}}, "functions"),
        ({"tool_choice": "required"}, "tool_choice"),  # without tools
        ({"extra_body": {"structural_tag": "{}"}}, "structural_tag"),
        ({"extra_body": {"lora_path": "x"}}, "lora_path"),
        ({"max_tokens": 300}, "maximum context length"),
    ],
)
def test_refused_by_name(client, extra, field):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], **{"max_tokens": 2, **extra}
        )
    assert field in str(err.value)


def test_response_format_text_is_plain(client):
    out = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2, response_format={"type": "text"}
    )
    assert out.choices[0].finish_reason in ("length", "stop")
