"""`gleanrl serve --reasoning-parser`: `reasoning_content` beside `content` on the chat route, in the
reply and in streamed deltas, SGLang's `separate_reasoning` / `stream_reasoning` fields and its
`/separate_reasoning` route, through the official `openai` client on a real server."""

from __future__ import annotations

import httpx
import openai
import pytest

from serving import running_server

MSGS = [{"role": "user", "content": "What is 12 + 30?"}]
GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def url(tiny_qwen2):
    with running_server(tiny_qwen2, context_length=256, reasoning_parser="deepseek-r1") as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


def _streamed(client, **kw) -> tuple[str, str]:
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model="m", messages=MSGS, stream=True, **kw):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
    return reasoning, content


def test_reasoning_content_apart_streamed_and_not(client):
    plain = (
        client.chat.completions.create(
            model="m",
            messages=MSGS,
            **GREEDY,
        )
        .choices[0]
        .message
    )
    whole = (
        client.chat.completions.create(
            model="m", messages=MSGS, **{**GREEDY, "extra_body": {"ignore_eos": True, "separate_reasoning": False}}
        )
        .choices[0]
        .message
    )
    assert whole.content and getattr(whole, "reasoning_content", None) is None
    # R1 reasons until </think>: a reply cut off before it is all reasoning
    assert (plain.reasoning_content, plain.content) == ReasoningSplit.r1(whole.content)
    assert _streamed(client, **GREEDY) == ReasoningSplit.r1(whole.content)
    held = {**GREEDY, "extra_body": {"ignore_eos": True, "stream_reasoning": False}}
    assert _streamed(client, **held) == ReasoningSplit.r1(whole.content)


class ReasoningSplit:
    @staticmethod
    def r1(text: str) -> tuple[str, str]:
        reasoning, sep, content = text.removeprefix("<think>").partition("</think>")
        return (reasoning, content) if sep else (text, "")


def test_separate_reasoning_route(url):
    body = {"text": "<think>step one</think>42", "reasoning_parser": "qwen3"}
    r = httpx.post(f"{url}/separate_reasoning", json=body, timeout=30)
    assert r.status_code == 200 and r.json() == {"reasoning_text": "step one", "text": "42"}
    r = httpx.post(f"{url}/separate_reasoning", json={**body, "return_blocks": True}, timeout=30)
    assert r.json()["blocks"] == [{"type": "reasoning", "text": "step one"}, {"type": "text", "text": "42"}]
    r = httpx.post(f"{url}/separate_reasoning", json={**body, "reasoning_parser": "nope"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_parser"


def test_unknown_parser_refused_at_startup():
    from gleanrl.server.http.config import ServerConfig

    with pytest.raises(ValueError, match="reasoning_parser"):
        ServerConfig(reasoning_parser="nope")
