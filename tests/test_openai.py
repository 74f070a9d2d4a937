"""The OpenAI API over a real server, through the official `openai` client: models, completions,
chat (the model's chat template), streaming, usage, finish_reason, logprobs, errors in
OpenAI's shape."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from engine_util import hf_greedy
from serving import running_server

KEY = "sk-openai-test"
NAME = "tiny-policy"


@pytest.fixture(scope="module")
def url(tiny_qwen2):
    with running_server(tiny_qwen2, api_key=KEY, served_model_name=NAME, context_length=256) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_completion_matches_transformers_with_usage_and_logprobs(client, hf, tok):
    prompt = "The quick brown fox"
    ids = tok.encode(prompt)
    out = client.completions.create(model=NAME, prompt=prompt, max_tokens=10, logprobs=1, **GREEDY)
    want = hf_greedy(hf, ids, 10)
    choice = out.choices[0]
    assert choice.text == tok.decode(want) and choice.finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        len(ids),
        10,
        len(ids) + 10,
    )
    assert len(choice.logprobs.token_logprobs) == 10 and all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    batch = client.completions.create(model=NAME, prompt=[ids, ids], max_tokens=4, n=2, **GREEDY)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert {c.text for c in batch.choices} == {tok.decode(want[:4])}
    assert batch.usage.prompt_tokens == 2 * len(ids) and batch.usage.completion_tokens == 16


def test_completion_stop_string_is_trimmed(client, hf, tok):
    prompt = "Hello, world!"
    full = tok.decode(hf_greedy(hf, tok.encode(prompt), 12))
    stop = full[4:6]
    assert stop.strip() and stop in full
    out = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, stop=[stop], **GREEDY)
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == full[: full.find(stop)]
    streamed = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, stop=[stop], stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full[: full.find(stop)]


def test_chat_uses_the_template_and_streams_the_same_text(client, hf, tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 30?"}]
    ids = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(ids, add_special_tokens=False)
    want = tok.decode(hf_greedy(hf, ids, 12), skip_special_tokens=True)
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=12, logprobs=True, **GREEDY)
    msg = out.choices[0].message
    assert msg.role == "assistant" and msg.content == want and out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 12
    assert len(out.choices[0].logprobs.content) == 12
    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=messages, max_tokens=12, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices


def test_chat_ends_at_eos_with_stop(client):
    out = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=200,
        temperature=0,
        extra_body={"stop_token_ids": list(range(384))},
    )
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 1


def test_errors_in_openai_shape(client, url):
    for kw, param in (
        ({"temperature": -1}, "temperature"),
        ({"top_p": 2}, "top_p"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"n": 100}, "n"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=NAME, prompt="hi", **{"max_tokens": 2, **kw})
        err = exc.value.body
        assert exc.value.status_code == 400 and param in err["message"], err
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=NAME, prompt="word " * 300, max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    r = httpx.post(
        f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, json={"model": NAME, "messages": "hi"}
    )
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.json()["error"]["param"] == "messages"
    ok = client.completions.create(model=NAME, prompt="hi", max_tokens=3, **GREEDY)
    assert ok.usage.completion_tokens == 3


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen3"])
def test_other_architectures_serve_chat_and_greedy(arch, request):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = request.getfixturevalue(arch)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "Hello, world!"}]
    ids = tok.encode(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    with running_server(path) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        out = client.chat.completions.create(
            model=client.models.list().data[0].id, messages=messages, max_tokens=8, **GREEDY
        )
        assert out.choices[0].message.content == tok.decode(hf_greedy(model, ids, 8), skip_special_tokens=True)
