"""A grammar together with a reasoning parser (issue 39, parity difference 4): as SGLang's
ReasonerGrammarObject, the chat route's regex / json_schema / ebnf / response_format and /generate's
with `require_reasoning` hold only the answer after `</think>`; the reasoning is free. On real
servers through the official `openai` client and /generate, with a random tiny model whose
vocabulary has `<think>` / `</think>` (one token each, as Qwen3 / DeepSeek-R1): it never writes
`</think>` by itself, so a logit bias on that token ends its reasoning."""

from __future__ import annotations

import json
import re
from contextlib import ExitStack

import httpx
import openai
import pytest

from serving import running_server

REGEX = r"(yes|no)\."
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "Is it raining in Paris?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from gleanrl.tiny import build_tokenizer, make_tiny_model

    tok = build_tokenizer()
    tok.add_tokens(["<think>", "</think>"])
    return make_tiny_model(tmp_path_factory.mktemp("think"), tokenizer=tok)


@pytest.fixture(scope="module")
def end_id(model) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).convert_tokens_to_ids("</think>")


@pytest.fixture(scope="module")
def urls(model):
    common = {"context_length": 256, "constrained_json_disable_any_whitespace": True}
    with ExitStack() as stack:
        yield {
            "r1": stack.enter_context(running_server(model, sd="off", reasoning_parser="deepseek-r1", **common)),
            "sd": stack.enter_context(
                running_server(model, sd="on", sd_sources=("group",), reasoning_parser="deepseek-r1", **common)
            ),
            "none": stack.enter_context(running_server(model, sd="off", **common)),
        }


def _chat(url: str, **kw):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    return client.chat.completions.create(model="m", messages=MSGS, temperature=0, **kw).choices[0]


def _generate(url: str, require_reasoning: bool | None = None, **sp) -> httpx.Response:
    body = {"text": "Is it raining? ", "sampling_params": {"temperature": 0, "max_new_tokens": 40, **sp}}
    if require_reasoning is not None:
        body["require_reasoning"] = require_reasoning
    return httpx.post(f"{url}/generate", json=body, timeout=120)


def test_chat_reasoning_is_free_and_the_answer_follows_the_grammar(urls, end_id):
    # unbiased, the random model never writes </think>: every token is free reasoning, cut by the limit
    out = _chat(urls["r1"], max_tokens=12, extra_body={"regex": REGEX})
    assert out.finish_reason == "length" and not out.message.content, out
    assert not re.match("yes|no", out.message.reasoning_content), out
    # </think> favoured: reasoning, then the answer as the grammar says
    bias = {str(end_id): 1.5}  # past the reasoning's first tokens
    out = _chat(urls["r1"], max_tokens=40, logit_bias=bias, extra_body={"regex": REGEX})
    assert out.message.reasoning_content and re.fullmatch(REGEX, out.message.content), out
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    out = _chat(urls["r1"], max_tokens=40, logit_bias=bias, response_format=fmt)
    assert json.loads(out.message.content) in ({"answer": "yes"}, {"answer": "no"}), out
    # no reasoning parser: the grammar holds the output from its first token
    out = _chat(urls["none"], max_tokens=12, extra_body={"regex": REGEX})
    assert re.fullmatch(REGEX, out.message.content), out


def test_generate_require_reasoning_holds_the_grammar_after_think(urls, end_id):
    bias = {str(end_id): 2.0}  # past the reasoning's first tokens
    r = _generate(urls["r1"], True, regex=REGEX, logit_bias=bias)
    assert r.status_code == 200, r.text
    reasoning, sep, answer = r.json()["text"].partition("</think>")
    assert reasoning and sep and re.fullmatch(REGEX, answer), r.json()["text"]
    # SD stays lossless under the wrapped grammar: greedy output unchanged
    for _ in range(2):  # group drafts come from the prompt's earlier samples
        assert _generate(urls["sd"], True, regex=REGEX, logit_bias=bias).json()["text"] == r.json()["text"]
    # without the field, as SGLang: the grammar from the first token, even with a parser
    r = _generate(urls["r1"], regex=REGEX, logit_bias=bias)
    assert re.fullmatch(REGEX, r.json()["text"]), r.text


def test_require_reasoning_without_a_parser(urls):
    """SGLang ignores require_reasoning without --reasoning-parser; a grammar it would hold is
    refused by name here, and without a grammar the field changes nothing (as SGLang's output)."""
    r = _generate(urls["none"], True, regex=REGEX)
    assert r.status_code == 400 and r.json()["error"]["param"] == "require_reasoning", r.text
    assert "--reasoning-parser" in r.json()["error"]["message"]
    r = _generate(urls["none"], True, max_new_tokens=4)
    assert r.status_code == 200 and r.json()["text"] == _generate(urls["none"], max_new_tokens=4).json()["text"]


@pytest.mark.parametrize("kind", ["json_schema", "regex", "ebnf"])
def test_answer_tag_accepts_reasoning_then_the_grammar(kind, tiny_tokenizer):
    """The structural tag holds exactly the request's grammar after </think> (JSON without free
    whitespace under --constrained-json-disable-any-whitespace, as without reasoning)."""
    import xgrammar as xgr

    from gleanrl.server.http.config import ServerConfig
    from gleanrl.server.http.generate.grammar import _answer_tag
    from test_tool_parser import _acceptor

    source, answer = {
        "json_schema": (json.dumps(SCHEMA), '{"answer": "yes"}'),
        "regex": (REGEX, "no."),
        "ebnf": ('root ::= ("yes" | "no") "."', "yes."),
    }[kind]
    cfg = ServerConfig(constrained_json_disable_any_whitespace=True)
    forced = _acceptor(tiny_tokenizer, _answer_tag(xgr, kind, source, "forced", cfg))
    assert forced("some <b>free</b> text</think>" + answer) and forced("</think>" + answer)
    assert not forced(answer) and not forced("x</think> " + answer) and not forced("x</think>" + answer + "!")
    optional = _acceptor(tiny_tokenizer, _answer_tag(xgr, kind, source, "optional", cfg))
    assert optional("<think>free</think>" + answer) and optional(answer) and not optional("free</think>" + answer)
