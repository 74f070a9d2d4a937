"""What evaluation and serving clients send, answered as SGLang 0.5.23 answers it (issue 32, item 1):
`/v1/completions` logprobs up to --max-top-logprobs-num (SGLang has no limit, vLLM allows 20),
clients' own `model` names on the chat route, `/tokenize` and `/detokenize` in SGLang's shapes."""

from __future__ import annotations

import httpx
import openai
import pytest

from serving import running_server


@pytest.fixture(scope="module")
def url(tiny_qwen2):
    with running_server(tiny_qwen2, context_length=256, max_top_logprobs_num=20) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


def test_completion_logprobs_up_to_the_flag(client):
    for k in (10, 20):
        out = client.completions.create(
            model="any", prompt="hi", max_tokens=3, logprobs=k, temperature=0, extra_body={"ignore_eos": True}
        )
        top = out.choices[0].logprobs.top_logprobs
        assert len(top) == 3 and all(len(t) == k for t in top)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="any", prompt="hi", max_tokens=3, logprobs=21)
    assert "logprobs must be in [0, 20]" in str(err.value)


def test_chat_serves_a_clients_model_name(client):
    out = client.chat.completions.create(
        model="meta-llama/Llama-3.1-8B-Instruct", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert out.model == "meta-llama/Llama-3.1-8B-Instruct" and out.choices[0].message.content


def test_tokenize_and_detokenize_shapes(url, tok):
    post = lambda path, body: httpx.post(f"{url}{path}", json=body, timeout=60)  # noqa: E731
    r = post("/tokenize", {"prompt": "The quick brown fox"})
    assert r.status_code == 200, r.text
    want = tok.encode("The quick brown fox")
    assert r.json()["tokens"] == want and r.json()["count"] == len(want)
    assert r.json()["max_model_len"] == 256  # the tiny tokenizer's length is unbounded
    r = post("/v1/tokenize", {"prompt": ["a b", "c"], "add_special_tokens": False})
    assert r.json()["tokens"] == [tok.encode("a b"), tok.encode("c")]
    assert r.json()["count"] == [len(tok.encode("a b")), len(tok.encode("c"))]
    msgs = [{"role": "user", "content": "hi"}]
    r = post("/tokenize", {"messages": msgs})
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert r.json()["tokens"] == tok.encode(text, add_special_tokens=False)
    r = post("/detokenize", {"tokens": want})
    assert r.status_code == 200 and r.json() == {"text": tok.decode(want)}
    r = post("/v1/detokenize", {"tokens": [want, want[:2]]})
    assert r.json() == {"text": [tok.decode(want), tok.decode(want[:2])]}
    assert post("/detokenize", {"tokens": []}).json() == {"text": ""}


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": []}, "prompt"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": "x"}, "tokens"),
    ],
)
def test_tokenize_bad_input_names_the_field(url, path, body, field):
    r = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
