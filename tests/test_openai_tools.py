"""Tool calls on the chat route (issue 32) through the official `openai` client on real servers:
`tools` in the chat template, `tool_choice` required / named forced by a grammar (a tiny random
model never calls a tool by itself), `tool_calls` in the reply and in streamed deltas, and the round trip
request -> tool_calls -> a `tool` message -> the final answer; bad tool fields refused by name."""

from __future__ import annotations

import json
from contextlib import ExitStack

import httpx
import openai
import pytest

from serving import running_server, server_stats

# Qwen 2.5's tool layout, shortened: the tools in a system turn, calls as <tool_call> JSON,
# tool answers in a user turn
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    '{% for c in m.tool_calls %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
SUM = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "add", "description": "add", "parameters": SUM}},
]
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather"}}
ANSWER = {"regex": "It is (sunny|rainy)\\."}  # forces the final answer's text


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from gleanrl.tiny import build_tokenizer, make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tools"), tokenizer=build_tokenizer(chat_template=TEMPLATE))


@pytest.fixture(scope="module")
def urls(model):
    common = {"context_length": 1024, "constrained_json_disable_any_whitespace": True}
    with ExitStack() as stack:
        yield {
            name: stack.enter_context(running_server(model, tool_call_parser=name, **common))
            for name in ("qwen25", "llama3")
        } | {
            "none": stack.enter_context(running_server(model, **common)),
            "sd": stack.enter_context(
                running_server(model, tool_call_parser="qwen25", sd="on", sd_sources=("group",), **common)
            ),
            "r1": stack.enter_context(
                running_server(model, tool_call_parser="qwen25", reasoning_parser="deepseek-r1", **common)
            ),
        }


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def _args(call) -> dict:
    return json.loads(call.function.arguments)


def _streamed(client, **kw) -> tuple[str, list[dict], str]:
    """(content, calls as {id, name, arguments}, finish_reason) from the deltas."""
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                if d.id:  # the first delta of a call carries its id and name
                    assert d.index not in calls and d.function.name
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:
                    assert d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments or ""
            reason = c.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("parser", ["qwen25", "llama3"])
def test_named_tool_call_round_trip(urls, parser):
    client = _client(urls[parser])
    # one call (greedy, a random model may repeat calls until the length limit)
    ask = {
        "model": "m",
        "messages": MSGS,
        "tools": TOOLS,
        "tool_choice": WEATHER,
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 150,
    }
    out = client.chat.completions.create(**ask).choices[0]
    assert out.finish_reason == "tool_calls" and not out.message.content
    (call,) = out.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and _args(call)["city"] in ("Paris", "Rome")
    # streamed under greedy: the same call, its id and name first, the arguments in pieces
    content, calls, reason = _streamed(client, **ask)
    assert (content, reason) == ("", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", _args(call))]
    # the call and its answer go back; tool_choice none and a regex force the final answer
    history = MSGS + [
        out.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    final = client.chat.completions.create(
        model="m", messages=history, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=20, extra_body=ANSWER
    ).choices[0]
    assert final.finish_reason == "stop" and final.message.tool_calls is None
    assert final.message.content in ("It is sunny.", "It is rainy.")
    # the same round trip streamed: the streamed call goes back as the history
    (streamed,) = calls
    history = MSGS + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": streamed["id"],
                    "type": "function",
                    "function": {"name": streamed["name"], "arguments": streamed["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": streamed["id"], "content": "sunny, 21 C"},
    ]
    content, calls, reason = _streamed(
        client,
        model="m",
        messages=history,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=20,
        extra_body=ANSWER,
    )
    assert (content, calls, reason) == (final.message.content, [], "stop")


def test_required_sampled_calls_are_valid(urls):
    """At T = 1 every sample calls tools with arguments valid for their schemas (the last call
    may be cut off when a random model keeps calling until the length limit)."""
    client = _client(urls["qwen25"])
    out = client.chat.completions.create(
        model="m", messages=MSGS, tools=TOOLS, tool_choice="required", temperature=1, n=6, seed=3, max_tokens=150
    )
    for choice in out.choices:
        calls = choice.message.tool_calls
        assert choice.finish_reason in ("tool_calls", "length") and calls
        complete = calls if choice.finish_reason == "tool_calls" else calls[:-1]
        for call in complete:
            assert (call.function.name, set(_args(call))) in (("get_weather", {"city"}), ("add", {"a"}))
    one = client.chat.completions.create(
        model="m",
        messages=MSGS,
        tools=TOOLS,
        n=4,
        seed=5,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1,
        max_tokens=200,
    )
    assert all(c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1 for c in one.choices)


def test_sd_forced_calls_equal_plain_decoding(urls):
    """Group drafts (the prompt's earlier samples) verified under the tool grammar: greedy calls
    identical to plain decoding's, streamed and not, sampled ones valid."""
    ask = {
        "model": "m",
        "messages": MSGS,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 150,
    }

    def calls(url: str, **kw) -> list:
        out = _client(url).chat.completions.create(**{**ask, **kw}).choices
        return [[(c.function.name, c.function.arguments) for c in o.message.tool_calls or []] for o in out]

    want = calls(urls["qwen25"])
    assert want[0] and calls(urls["sd"]) == want and calls(urls["sd"]) == want
    assert server_stats(urls["sd"])["spec_accept_token_num_by_source"]["group"] > 0
    _, streamed, _ = _streamed(_client(urls["sd"]), **ask)
    assert [(c["name"], c["arguments"]) for c in streamed] == want[0]
    for sample in calls(urls["sd"], temperature=1, n=4, seed=7, parallel_tool_calls=False):
        ((name, args),) = sample
        assert set(json.loads(args)) == ({"city"} if name == "get_weather" else {"a"})


def test_a_reasoning_model_reasons_before_the_forced_call(urls):
    """With a reasoning parser whose model starts inside the reasoning (deepseek-r1), the grammar
    lets it reason up to </think> before the calls: a random model cut off by the length limit
    has reasoned and called nothing."""
    out = (
        _client(urls["r1"])
        .chat.completions.create(
            model="m", messages=MSGS, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=12
        )
        .choices[0]
    )
    assert out.finish_reason == "length" and out.message.tool_calls is None
    assert out.message.reasoning_content and not out.message.content
    assert not out.message.reasoning_content.startswith("<tool_call>")  # not forced yet


def test_template_renders_tools_and_history(urls, model):
    """The prompt the server counts is the template over the tools and a history holding an
    assistant's tool_calls and a tool answer (arguments as an object, as templates read them)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    history = MSGS + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy"},
    ]
    rendered = [
        *MSGS,
        {**history[1], "tool_calls": [{**call, "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        history[2],
    ]
    text = tok.apply_chat_template(rendered, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}' in text
    assert "<tool_response>\nrainy" in text and '"name": "add"' in text
    out = _client(urls["qwen25"]).chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=1)
    assert out.usage.prompt_tokens == len(tok(text, add_special_tokens=False).input_ids)


def test_auto_without_a_call_is_content(urls):
    """tool_choice auto: the random model writes no call, its text is the content."""
    out = (
        _client(urls["qwen25"])
        .chat.completions.create(
            model="m", messages=MSGS, tools=TOOLS, temperature=0, max_tokens=8, extra_body={"ignore_eos": True}
        )
        .choices[0]
    )
    assert out.message.tool_calls is None and out.message.content
    assert out.finish_reason == "length"
    # another grammar holds the output: it is not parsed for calls (SGLang)
    out = (
        _client(urls["qwen25"])
        .chat.completions.create(
            model="m",
            messages=MSGS,
            tools=TOOLS,
            temperature=0,
            max_tokens=60,
            extra_body={"regex": r'<tool_call>\n\{"name": "add", "arguments": \{\}\}'},
        )
        .choices[0]
    )
    assert out.message.tool_calls is None
    assert out.message.content == '<tool_call>\n{"name": "add", "arguments": {}}'


BAD = [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"parameters": CITY}}]}, "tools.0.function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "x"}}}]},
        "tools.0.function.parameters",
    ),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "regex": "a+"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}]}, "functions"),
    (
        {
            "messages": MSGS
            + [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1"}}],
                }
            ]
        },
        "messages.1.tool_calls.0.function.arguments",
    ),
]


@pytest.mark.parametrize(("extra", "field"), BAD)
def test_bad_tool_fields_refused_by_name(urls, extra, field):
    body = {"model": "m", "messages": MSGS, "max_tokens": 4, **extra}
    r = httpx.post(f"{urls['qwen25']}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_forced_choice_needs_a_parser_and_completions_refuse_tools(urls):
    body = {"model": "m", "messages": MSGS, "tools": TOOLS, "tool_choice": "required"}
    r = httpx.post(f"{urls['none']}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "--tool-call-parser" in r.json()["error"]["message"]
    r = httpx.post(f"{urls['none']}/v1/completions", json={"model": "m", "prompt": "a", "tools": TOOLS}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    # without a parser, tool_choice auto: the template gets the tools, the output is content
    out = _client(urls["none"]).chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=4)
    assert out.choices[0].message.tool_calls is None


def test_unknown_parser_refused_at_startup():
    from gleanrl.server.http.config import ServerConfig

    with pytest.raises(ValueError, match="tool_call_parser"):
        ServerConfig(tool_call_parser="nope")
