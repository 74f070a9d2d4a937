"""The tool-call parsers against stock SGLang 0.5.23's own (`sglang.srt.function_call`), one-shot
and streamed character by character, on the same outputs (issue 32: parity where SGLang runs here).
Compared: the calls (names, arguments as JSON values) and the text around them, stripped. Where the
two differ on purpose (`server.http.openai.tool_parser`'s docstring): SGLang's one-shot path keeps only the
text before the first call, its streamed path leaves a `</tool_call>` separator newline in the
content, and it streams the rest of a call to an unknown function as content (gleanrl drops the
call on both paths); those outputs are left out here."""

from __future__ import annotations

import json

from gleanrl.server.http.openai.tool_parser import ToolCallParser, parse_calls
from sglang_util import run_in_sglang

NAMES = ["get_weather", "add"]
TEXTS = {
    "qwen25": [
        'hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "plain text, no call",
        '<tool_call>\n{"name": "add", "arguments": {"a": [1, "}"], "b": {"c": null}}}\n</tool_call>',
        '<tool_call>\n{"arguments": {"x": 1}, "name": "add"}\n</tool_call>',
    ],
    "hermes": [
        '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>',
        'text <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>',
    ],
    "llama3": [
        '{"name": "add", "parameters": {"a": 1}}',
        '<|python_tag|>{"name": "add", "arguments": {"a": 2}}',
        '{"name": "add", "parameters": {"a": 1}};{"name": "get_weather", "parameters": {"city": "x"}}',
        "no call here",
    ],
}
SCRIPT = """
import json, sys
from sglang.srt.entrypoints.openai.protocol import Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser
names, cases = json.loads(sys.argv[1])
tools = [Tool(type="function", function={"name": n, "parameters": {}}) for n in names]
out = []
for parser, text in cases:
    content, items = FunctionCallParser(tools, parser).parse_non_stream(text)
    one = [content.strip(), [[c.name, json.loads(c.parameters)] for c in items]]
    p, content, calls = FunctionCallParser(tools, parser), "", {}
    for ch in text:
        t, items = p.parse_stream_chunk(ch)
        content += t or ""
        for c in items:
            calls.setdefault(c.tool_index, [c.name, ""])[1] += c.parameters
    t, items = p.parse_stream_end()
    content += t or ""
    streamed = [content.strip(), [[n, json.loads(a)] for _, (n, a) in sorted(calls.items())]]
    out.append([one, streamed])
print(json.dumps(out))
"""


def _ours(parser: str, text: str) -> list:
    content, calls = parse_calls(ToolCallParser(parser, NAMES), text)
    return [content.strip(), [[c["function"]["name"], json.loads(c["function"]["arguments"])] for c in calls]]


def test_tool_parsers_match_sglang():
    cases = [(parser, text) for parser, texts in TEXTS.items() for text in texts]
    theirs = run_in_sglang(SCRIPT, json.dumps([NAMES, cases]))
    mismatches = [(c, mine, want) for c, want in zip(cases, theirs) if [mine := _ours(*c)] * 2 != want]
    assert not mismatches, mismatches
