"""The tool-call parsers (`server.http.openai.tool_parser`): each format, one-shot and streamed, the
streamed result equal to the one-shot one at every cut point (two cuts anywhere, and character by
character), calls to unknown functions dropped, `max_calls`, and the grammar that forces the calls
accepts what the parser reads."""

from __future__ import annotations

import json

import pytest

from gleanrl.server.http.openai.tool_parser import FORMATS, ToolCallParser, json_end, parse_calls

NAMES = ["get_weather", "add"]
CASES = {
    "qwen25": [
        'hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name":"add", "arguments":{"a": [1, "}\\""]}}\n</tool_call>',
        "plain text, no call",
        '<tool_call>\n{"arguments": {"x": 1}, "name": "add"}\n</tool_call> after',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>x',
        '<tool_call>\n{"name": "add", "arguments": {"a": 1',
        "a <tool_ca",
        '<tool_call>\n{"name": "add", "arguments": 5}\n</tool_call>\n\n',
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}\n</tool_call>',
        '<tool_call>{"arguments": {}, "name": ["add"]}</tool_call>',  # not a name: dropped
    ],
    "hermes": [
        '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>',
        'text<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "argu',
    ],
    "llama3": [
        '{"name": "add", "parameters": {"a": 1}}; {"name": "get_weather", "parameters": {"c": 2}}',
        '<|python_tag|>{"name":"add", "arguments":{"a":2}}',
        'hello {"name": "add", "parameters": {}}',
        '  {"name": "add", "parameters": {"a": "{"}}',
        '<|python_tag|>{"name": "add", "arguments": {"a": 1}};<|python_tag|>{"name": "add", "arguments": {"a": 2}}',
    ],
}
ALL = [(name, text) for name, texts in CASES.items() for text in texts]


def _streamed(name: str, pieces: list[str], max_calls: int | None = None):
    parser, content, calls = ToolCallParser(name, NAMES, max_calls), "", []
    for piece in [*pieces, None]:
        text, deltas = parser.feed(piece) if piece is not None else parser.finish()
        content += text
        for d in deltas:
            if d.id:
                assert d.index == len(calls) and d.name  # the first delta: id and name
                calls.append([d.name, ""])
            calls[d.index][1] += d.arguments
    return content, calls


def _whole(name: str, text: str, max_calls: int | None = None):
    content, calls = parse_calls(ToolCallParser(name, NAMES, max_calls), text)
    assert all(c["id"].startswith("call_") and c["index"] == k for k, c in enumerate(calls))
    return content, [[c["function"]["name"], c["function"]["arguments"]] for c in calls]


@pytest.mark.parametrize(("name", "text"), ALL)
def test_streamed_equals_whole_at_every_cut(name, text):
    whole = _whole(name, text)
    assert _streamed(name, list(text)) == whole
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert _streamed(name, [text[:i], text[i:j], text[j:]]) == whole, (i, j)


def test_what_each_format_reads():
    assert _whole("qwen25", CASES["qwen25"][0]) == (
        "hi ",
        [["get_weather", '{"city": "Paris"}'], ["add", '{"a": [1, "}\\""]}']],
    )
    assert _whole("qwen25", CASES["qwen25"][1]) == ("plain text, no call", [])
    # not name-first: read when the call closes, the arguments re-serialised
    assert _whole("qwen25", CASES["qwen25"][2]) == (" after", [["add", '{"x": 1}']])
    assert _whole("qwen25", CASES["qwen25"][3]) == ("x", [])  # unknown: dropped
    assert _whole("qwen25", CASES["qwen25"][4]) == ("", [["add", '{"a": 1']])  # cut off
    assert _whole("qwen25", CASES["qwen25"][5]) == ("a <tool_ca", [])
    assert _whole("qwen25", CASES["qwen25"][6]) == ("", [["add", "5"]])
    assert _whole("qwen25", CASES["qwen25"][8]) == ("", [])
    assert _whole("hermes", CASES["hermes"][1]) == ("text", [["get_weather", '{"city": "Rome"}'], ["add", "{}"]])
    assert _whole("llama3", CASES["llama3"][0]) == ("", [["add", '{"a": 1}'], ["get_weather", '{"c": 2}']])
    assert _whole("llama3", CASES["llama3"][2]) == ('hello {"name": "add", "parameters": {}}', [])
    assert _whole("llama3", CASES["llama3"][4]) == ("", [["add", '{"a": 1}'], ["add", '{"a": 2}']])
    assert _whole("llama3", CASES["llama3"][0], max_calls=1) == ("", [["add", '{"a": 1}']])


def test_json_end():
    assert json_end('  {"a": "}"} x', 0) == 12
    assert json_end("[1, [2]", 0) is None and json_end("5", 0) is None


@pytest.mark.parametrize("parser", sorted(FORMATS))
def test_forcing_grammar_accepts_what_the_parser_reads(parser, tiny_tokenizer):
    """The structural tag `tools.forcing_grammar` builds for tool_choice required accepts two calls
    in the parser's format (and nothing before them), and the parser reads them back."""
    from gleanrl.server.http.config import ServerConfig
    from gleanrl.server.http.openai.tools import ToolPlan, forcing_grammar

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tools = [{"type": "function", "function": {"name": "add", "parameters": schema}}]
    plan = ToolPlan(tools, ["add"], parser, True, None)
    _, source, _ = forcing_grammar(plan, ServerConfig())
    fmt = FORMATS[parser]
    one = fmt.begin.format(name="add") + '{"a": 1}' + fmt.close
    text = one + fmt.separator + one.replace("1", "2")
    accepts = _acceptor(tiny_tokenizer, source)
    assert accepts(text) and not accepts("x" + text)
    assert [json.loads(a) for _, a in _whole(parser, text)[1]] == [{"a": 1}, {"a": 2}]
    # a reasoning model reasons first: to </think> (the output starts inside the reasoning), or
    # in an optional <think> block
    forced = _acceptor(tiny_tokenizer, forcing_grammar(plan, ServerConfig(), "forced")[1])
    assert forced("Let me see.</think>\n\n" + one) and not forced(one)
    optional = _acceptor(tiny_tokenizer, forcing_grammar(plan, ServerConfig(), "optional")[1])
    assert optional("<think>Let me see.</think>\n" + one) and optional(one)
    assert not optional("Let me see.</think>" + one)


def _acceptor(tok, source: str):
    """Whether the structural tag `source` accepts a text and then the end of the output."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_structural_tag(source)

    def accepts(text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiled)
        return all(
            matcher.accept_token(t) for t in tok.encode(text, add_special_tokens=False)
        ) and matcher.accept_token(tok.eos_token_id)

    return accepts
