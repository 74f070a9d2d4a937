"""Reasoning parsers: `<think>…</think>` apart from the answer, one-shot and streamed, as SGLang 0.5.23's
`BaseReasoningFormatDetector`. Names as its `--reasoning-parser`: `deepseek-r1` (reasoning until
`</think>`, the opening tag optional), `qwen3` (only inside `<think>`, or from the start when the template
opened it; `<tool_call>` closes it), `qwen3-thinking` (always reasoning first), and SGLang's aliases.
Streaming holds back a tail that may start a tag, so a split tag never leaks into either field."""

from __future__ import annotations

from dataclasses import dataclass

from gleanrl.server.http.edge.errors import bad_field
from gleanrl.server.http.generate.detok import tag_start

THINK, END = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class Style:
    force: bool  # reasoning from the first token, without the opening tag
    tool_start: str | None  # a tag that ends reasoning without </think>


R1, QWEN3, QWEN3_THINKING = Style(True, None), Style(False, "<tool_call>"), Style(True, "<tool_call>")
PARSERS = {  # SGLang's names for these two detectors (its DetectorMap)
    **dict.fromkeys(("deepseek-r1", "step3", "step3p5", "gigachat35"), R1),
    **dict.fromkeys(("qwen3", "dots", "nanbeige", "interns1"), QWEN3),
    **dict.fromkeys(("qwen3-thinking", "minimax"), QWEN3_THINKING),
}


def check_parser(name: str, field: str = "reasoning_parser") -> Style:
    style = PARSERS.get(name.lower()) if isinstance(name, str) else None
    if style is None:
        raise bad_field(field, f"unsupported reasoning parser {name!r}; supported: {', '.join(PARSERS)}")
    return style


class ReasoningParser:
    def __init__(self, name: str, template_opened: bool = False):
        """`template_opened`: the chat template ended the prompt with `<think>` (SGLang's `force_reasoning`)."""
        self.style = check_parser(name)
        self.in_reasoning = self.style.force or template_opened
        self.buffer, self.stripped = "", False

    def _cut(self, text: str) -> tuple[str, str] | None:
        """(reasoning, content) if the reasoning ends in `text` (</think>, or a tool call's tag)."""
        if END in text:
            reasoning, _, content = text.partition(END)
            return reasoning, content
        tool = text.find(self.style.tool_start) if self.style.tool_start else -1
        return (text[:tool], text[tool:]) if tool >= 0 else None

    def split(self, text: str) -> tuple[str, str]:
        """The whole output -> (reasoning, content), as SGLang's `detect_and_parse`."""
        if not (self.in_reasoning or THINK in text):
            return "", text
        while text.startswith(THINK):
            text = text[len(THINK) :]
        return self._cut(text) or (text, "")  # or cut off before </think>

    def feed(self, delta: str) -> tuple[str, str]:
        """A streamed delta -> (reasoning, content) to send now (SGLang's `parse_streaming_increment`)."""
        text = self.buffer + delta
        tags = [THINK, END] + ([self.style.tool_start] if self.style.tool_start else [])
        if any(t.startswith(text) and t != text for t in tags):
            self.buffer = text
            return "", ""
        if not self.stripped and THINK in text:
            text, self.stripped, self.in_reasoning = text.replace(THINK, "", 1), True, True
        if not self.in_reasoning:
            self.buffer = ""
            return "", text
        if cut := self._cut(text):
            self.buffer, self.in_reasoning = "", False
            return cut
        hold = max(tag_start(text, t) for t in tags)
        self.buffer = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], ""

    def finish(self) -> tuple[str, str]:
        """The stream ended: what was held back, in the field it belongs to."""
        rest, self.buffer = self.buffer, ""
        return (rest, "") if self.in_reasoning else ("", rest)
