"""Structured output through xgrammar (issue 32, item 3) on real servers, through the official
`openai` client and /generate: `response_format` json_schema / json_object, SGLang's `json_schema` /
`regex` / `ebnf` sampling parameters; every sample valid at T = 1 and greedy, plain and with SD on
(EAGLE-3 and group drafts), SD greedy identical to plain greedy; bad grammars refused by name."""

from __future__ import annotations

import json
import re
from contextlib import ExitStack

import httpx
import openai
import pytest

from sd_util import trained_drafter
from serving import running_server

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}
MSGS = [{"role": "user", "content": "The quick brown fox"}]
ARMS = ("plain", "eagle", "group")


def _valid(text: str) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(obj, dict)
        and set(obj) == {"answer", "n"}
        and obj["answer"] in ("yes", "no")
        and isinstance(obj["n"], int)
        and 0 <= obj["n"] <= 99
    )


@pytest.fixture(scope="module")
def urls(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    drafter = trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path_factory.mktemp("g") / "d")
    common = {"context_length": 256, "constrained_json_disable_any_whitespace": True}
    with ExitStack() as stack:
        yield {
            "plain": stack.enter_context(running_server(tiny_qwen2, sd="off", **common)),
            "eagle": stack.enter_context(  # through the engine process: grammars cross it as xgrammar's JSON
                running_server(tiny_qwen2, drafter=str(drafter), sd="on", engine_process=True, **common)
            ),
            "group": stack.enter_context(running_server(tiny_qwen2, sd="on", sd_sources=("group",), **common)),
        }


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.mark.parametrize("arm", ARMS)
def test_json_schema_valid_for_every_sample(urls, arm):
    client = _client(urls[arm])
    out = client.chat.completions.create(
        model="m", messages=MSGS, n=8, temperature=1, max_tokens=40, response_format=FORMAT, seed=1
    )
    texts = [c.message.content for c in out.choices]
    assert all(_valid(t) for t in texts), texts
    greedy = client.chat.completions.create(
        model="m", messages=MSGS, temperature=0, max_tokens=40, response_format=FORMAT
    )
    assert _valid(greedy.choices[0].message.content)
    # group drafts come from the prompt's other samples: the second round verifies them
    again = client.chat.completions.create(
        model="m", messages=MSGS, n=8, temperature=1, max_tokens=40, response_format=FORMAT, seed=2
    )
    assert all(_valid(c.message.content) for c in again.choices)


def test_sd_greedy_equals_plain_greedy_under_a_grammar(urls):
    def greedy(arm: str, verified: bool = False, **kw) -> list:
        r = httpx.post(
            f"{urls[arm]}/generate",
            timeout=300,
            json={
                "text": ["The quick brown fox", "Hello, world!"],
                "sampling_params": {"max_new_tokens": 40, "temperature": 0, **kw},
            },
        )
        assert r.status_code == 200, r.text
        if verified:  # verify passes of drafts ran under the grammar
            assert all(
                o["meta_info"]["spec_verify_ct"] > 0 and o["meta_info"]["spec_draft_token_num"] > 0 for o in r.json()
            ), (arm, kw, [o["meta_info"] for o in r.json()])
        return [o["output_ids"] for o in r.json()]

    for kw in (
        {"json_schema": json.dumps(SCHEMA)},
        {"regex": "[a-z ]{4,30}\\."},
        {"ebnf": 'root ::= "The" [ a-z]+ "."'},
    ):
        want = greedy("plain", **kw)
        assert greedy("eagle", verified=True, **kw) == want, kw
        # group drafts are the prompt's earlier samples: the first round gives the second its drafts
        assert greedy("group", **kw) == want, kw
        assert greedy("group", verified=True, **kw) == want, kw


def test_regex_and_json_object_on_the_openai_routes(urls):
    client = _client(urls["eagle"])
    out = client.completions.create(
        model="m", prompt="Hello", max_tokens=30, n=4, extra_body={"regex": "(yes|no), [0-9]{1,3}"}
    )
    assert all(re.fullmatch("(yes|no), [0-9]{1,3}", c.text) for c in out.choices), out
    out = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=60, temperature=0, response_format={"type": "json_object"}
    )
    assert out.choices[0].finish_reason == "length" or json.loads(out.choices[0].message.content)


def _is_object(text: str, finish: str) -> bool:
    """A json_object reply is a JSON object: whole when finished by stop, begun when cut by length."""
    if finish == "stop":
        try:
            return isinstance(json.loads(text), dict)
        except ValueError:
            return False
    return text.lstrip().startswith("{")


@pytest.mark.parametrize("arm", ["plain", "eagle"])
def test_json_object_is_a_json_object(urls, arm):
    """json_object constrains to an object (SGLang's `{"type": "object"}`), not any JSON value:
    arrays such as `[ 1E3` and `[false` were replies before issue 39."""
    client = _client(urls[arm])
    fmt = {"type": "json_object"}
    for temperature, n in ((1, 16), (0, 1)):
        out = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            n=n,
            max_tokens=16,
            seed=3,
            temperature=temperature,
            response_format=fmt,
        )
        got = [(c.message.content, c.finish_reason) for c in out.choices]
        assert all(_is_object(*g) for g in got), got
        out = client.completions.create(
            model="m",
            prompt="hi",
            max_tokens=16,
            n=n,
            seed=3,
            temperature=temperature,
            extra_body={"response_format": fmt},
        )
        got = [(c.text, c.finish_reason) for c in out.choices]
        assert all(_is_object(*g) for g in got), got


@pytest.mark.parametrize(
    "sp,field",
    [
        ({"json_schema": "{not json"}, "sampling_params.json_schema"),
        ({"regex": "[a-"}, "sampling_params.regex"),
        ({"ebnf": "root ::= missing_rule"}, "sampling_params.ebnf"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "sampling_params.ebnf"),
        ({"regex": "a" * (64 * 1024 + 1)}, "sampling_params.regex"),
        ({"structural_tag": "{}"}, "sampling_params.structural_tag"),
    ],
)
def test_bad_grammar_is_a_400_naming_the_field(urls, sp, field):
    r = httpx.post(f"{urls['plain']}/generate", json={"text": "hi", "sampling_params": sp}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_bad_response_format_is_refused_by_name(urls):
    client = _client(urls["plain"])
    for fmt, field in (
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
        ({"type": "xml"}, "response_format.type"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, response_format=fmt)
        assert field in str(err.value)
