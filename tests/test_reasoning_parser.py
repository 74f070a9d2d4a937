"""The reasoning parsers (`server.http.generate.reasoning`) against SGLang 0.5.23's detectors' documented
behaviour, and streaming equal to one-shot parsing for every way of cutting the text into deltas
(a tag split across deltas never leaks)."""

from __future__ import annotations

import random

import pytest

from gleanrl.server.http.generate.reasoning import ReasoningParser

CASES = [  # (parser, template opened <think>, text, reasoning, content)
    ("deepseek-r1", False, "I think.</think>The answer is 42.", "I think.", "The answer is 42."),
    ("deepseek-r1", False, "<think>I think.</think>42", "I think.", "42"),
    ("deepseek-r1", False, "cut off before the end", "cut off before the end", ""),
    ("qwen3", False, "<think>a b</think>\n\n42", "a b", "\n\n42"),
    ("qwen3", False, "no reasoning at all", "", "no reasoning at all"),
    ("qwen3", True, "opened by the template</think>ok", "opened by the template", "ok"),
    ("qwen3", False, "<think>plan<tool_call>{}</tool_call>", "plan", "<tool_call>{}</tool_call>"),
    ("qwen3-thinking", False, "r</think>c", "r", "c"),
]


@pytest.mark.parametrize("name,opened,text,reasoning,content", CASES)
def test_one_shot(name, opened, text, reasoning, content):
    assert ReasoningParser(name, opened).split(text) == (reasoning, content)


def _stream(name: str, opened: bool, text: str, cuts: list[int]) -> tuple[str, str]:
    parser, got = ReasoningParser(name, opened), ["", ""]
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        r, c = parser.feed(text[a:b])
        got = [got[0] + r, got[1] + c]
    r, c = parser.finish()
    return got[0] + r, got[1] + c


@pytest.mark.parametrize("name,opened,text,reasoning,content", CASES)
def test_streamed_equals_one_shot_for_every_cut(name, opened, text, reasoning, content):
    rng = random.Random(0)
    for cut in range(1, len(text)):  # every single cut, a tag's middle included
        assert _stream(name, opened, text, [cut]) == (reasoning, content), cut
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 6))))
        assert _stream(name, opened, text, cuts) == (reasoning, content), cuts
    assert _stream(name, opened, text, list(range(1, len(text)))) == (reasoning, content)
