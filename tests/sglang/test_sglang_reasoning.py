"""The reasoning parsers against stock SGLang 0.5.23's own (`sglang.srt.parser.reasoning_parser`),
one-shot and streamed token by token, on the same texts (issue 32: parity where SGLang runs here)."""

from __future__ import annotations

import json

from gleanrl.server.http.generate.reasoning import ReasoningParser
from sglang_util import run_in_sglang

TEXTS = [
    "I think.</think>The answer is 42.",
    "<think>I think.</think>42",
    "cut off",
    "",
    "<think>a b</think>\n\n42",
    "no reasoning",
    "x</think>ok",
    "<think>plan<tool_call>{}",
    "<thi",
    "a</thi",
    "</think>",
    "<think><think>a</think>b</think>c",
]
SCRIPT = """
import json, sys
from sglang.srt.parser.reasoning_parser import ReasoningParser
out = []
for name, force, text in json.loads(sys.argv[1]):
    one = ReasoningParser(name, stream_reasoning=True, force_reasoning=force).parse_non_stream(text)
    p = ReasoningParser(name, stream_reasoning=True, force_reasoning=force)
    r, c = "", ""
    for ch in text:
        a, b = p.parse_stream_chunk(ch)
        r, c = r + (a or ""), c + (b or "")
    a, b = p.parse_stream_end()
    out.append([[one[0] or "", one[1] or ""], [r + (a or ""), c + (b or "")]])
print(json.dumps(out))
"""


def _ours(name: str, opened: bool, text: str) -> list[list[str]]:
    one = ReasoningParser(name, opened).split(text)
    p, r, c = ReasoningParser(name, opened), "", ""
    for ch in text:
        a, b = p.feed(ch)
        r, c = r + a, c + b
    a, b = p.finish()
    return [list(one), [r + a, c + b]]


def test_reasoning_parsers_match_sglang():
    cases = [
        (name, force, t)
        for name, force in (("deepseek-r1", True), ("qwen3", False), ("qwen3", True), ("qwen3-thinking", True))
        for t in TEXTS
    ]
    theirs = run_in_sglang(SCRIPT, json.dumps(cases))
    mismatches = [(c, mine, want) for c, want in zip(cases, theirs) if (mine := _ours(*c)) != want]
    assert not mismatches, mismatches
