"""Tool-call parsers for SGLang 0.5.23's `--tool-call-parser` formats, one-shot and streamed: `qwen25`
(`qwen`) and `hermes`, `<tool_call>{"name": …, "arguments": …}</tool_call>` (newlines inside or not);
`llama3`, `<|python_tag|>{"name": …, "parameters": …}` or a bare JSON object opening the output, `;`
between calls. A whole reply is the streamed deltas merged (`parse_calls`), so both agree whatever the
chunking. Unlike SGLang, on purpose: `arguments` is the JSON text the model wrote, streamed as it
arrives; text outside the calls is `content` in both paths; whitespace between or after calls is
dropped. As SGLang: a call to a function not in `tools` is dropped; one cut off keeps what was written."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from gleanrl.server.http.generate.detok import tag_start

# name first, then the arguments (the streamed path); any other order is read when the call ends
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass(frozen=True, slots=True)
class Format:
    start: str  # opens a call
    end: str | None  # closes it (None: the JSON object's end)
    separator: str  # between calls (dropped)
    bare_first: bool  # a JSON object that opens the output is a call too
    begin: str  # the grammar's text before the arguments ({name} filled in)
    close: str  # ... and after them


QWEN25 = Format(
    "<tool_call>", "</tool_call>", "\n", False, '<tool_call>\n{{"name":"{name}", "arguments":', "}\n</tool_call>"
)
HERMES = Format(
    "<tool_call>", "</tool_call>", "\n", False, '<tool_call>{{"name":"{name}", "arguments":', "}</tool_call>"
)
LLAMA3 = Format("<|python_tag|>", None, ";", True, '<|python_tag|>{{"name":"{name}", "arguments":', "}")
FORMATS = {"qwen25": QWEN25, "qwen": QWEN25, "hermes": HERMES, "llama3": LLAMA3}


@dataclass(slots=True)
class CallDelta:
    """One streamed piece of a call, OpenAI's delta shape: the first carries id and name."""

    index: int
    id: str | None
    name: str | None
    arguments: str

    def as_dict(self) -> dict:
        fn = {"arguments": self.arguments, **({"name": self.name} if self.name else {})}
        head = {"id": self.id, "type": "function"} if self.id else {}
        return {"index": self.index, **head, "function": fn}


class JsonEnd:
    """Where the JSON object or array at `start` ends, read as the text grows (each character once)."""

    def __init__(self, start: int = 0):
        self.i, self.depth, self.in_str, self.esc = start, 0, False, False
        self.end: int | None = None
        self.scalar = False  # not an object or array: never ends here

    def __call__(self, text: str) -> int | None:
        if self.end is not None or self.scalar:
            return self.end
        for i in range(self.i, len(text)):
            c = text[i]
            if self.in_str:
                self.esc, self.in_str = (False, True) if self.esc else (c == "\\", c != '"')
            elif c == '"':
                self.in_str = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = i + 1
                    return self.end
            elif self.depth == 0 and not c.isspace():
                self.scalar = True  # read when the call ends
                return None
        self.i = len(text)
        return None


def json_end(text: str, start: int = 0) -> int | None:
    return JsonEnd(start)(text)


@dataclass(slots=True)
class _Call:
    """The open call: its body is the parser's buffer."""

    outer: JsonEnd  # the call's object (formats without an end tag)
    index: int | None = None  # None: not streamed (unknown function, or not name-first)
    args: JsonEnd | None = None  # the arguments' value, once the name-first head is read
    args_at: int | None = None
    sent: int = 0  # the arguments' characters streamed
    searched: int = 0  # the body searched for the end tag up to here


class ToolCallParser:
    def __init__(self, name: str, tools: list[str], max_calls: int | None = None):
        """`tools`: the function names that may be called; `max_calls`: 1 without parallel_tool_calls."""
        self.fmt, self.tools, self.max_calls = FORMATS[name], set(tools), max_calls
        self.buffer = ""  # unread text outside a call, or the open call's body
        self.calls, self.held = 0, ""
        self.started = False  # anything but whitespace seen (a bare call opens the output)
        self.after_call = False  # only whitespace since the last call closed
        self.call: _Call | None = None

    def _open(self, body: str) -> None:
        self.call, self.buffer, self.started, self.held = _Call(JsonEnd()), body, True, ""

    def _text(self, text: str) -> str:
        """Text outside calls; after a call, trailing whitespace is held until more text follows."""
        text, self.held = self.held + text, ""
        if self.calls:
            body = text.rstrip()
            text, self.held = body, text[len(body) :]
        if text.strip():
            self.started, self.after_call = True, False
        return text

    def feed(self, delta: str) -> tuple[str, list[CallDelta]]:
        """A streamed piece of the output -> (content, call deltas) to send now."""
        self.buffer += delta
        content, out, fmt = "", [], self.fmt
        while True:
            if self.call is not None:
                if not self._read_call(out):
                    return content, out
                continue
            text = self.buffer
            if self.after_call and fmt.separator.strip():
                if not text.strip():
                    return content, out  # a separator may follow
                if text.lstrip().startswith(fmt.separator):
                    text = self.buffer = text.lstrip()[len(fmt.separator) :]
                    if not text.strip():
                        return content, out  # the next call may follow
            if fmt.bare_first and (not self.started or self.after_call):
                if text.lstrip().startswith("{"):
                    self._open(text)
                    continue
                if not self.started and not text.strip():
                    return content, out  # only whitespace: a call may follow
            pos = text.find(fmt.start)
            if pos >= 0:
                content += self._text(text[:pos])
                self._open(text[pos + len(fmt.start) :])
                continue
            hold = tag_start(text, fmt.start)
            content += self._text(text[: len(text) - hold])
            self.buffer = text[len(text) - hold :] if hold else ""
            return content, out

    def _read_call(self, out: list[CallDelta]) -> bool:
        """Advance the open call; True when it closed (the buffer then holds what follows)."""
        body, call, fmt = self.buffer, self.call, self.fmt
        if call.args_at is None and (m := _HEAD.match(body)) and body[m.end() :][:1] in ("{", "["):
            call.args_at, call.args = m.end(), JsonEnd(m.end())
            if self._known(m.group(1)):
                call.index = self.calls - 1
                out.append(CallDelta(call.index, _call_id(), m.group(1), ""))
        if fmt.end is None:
            close = rest = call.outer(body)
        else:
            pos = body.find(fmt.end, call.searched)
            call.searched = max(call.searched, len(body) - len(fmt.end) + 1)
            close, rest = (pos, pos + len(fmt.end)) if pos >= 0 else (None, None)
        if call.index is not None:  # stream the arguments' text as it comes
            stop = call.args(body)
            if stop is None:
                stop = close if close is not None else len(body) - (tag_start(body, fmt.end) if fmt.end else 0)
            piece = body[call.args_at + call.sent : stop]
            if piece:
                call.sent += len(piece)
                out.append(CallDelta(call.index, None, None, piece))
        if close is None:
            return False
        if call.args_at is None:  # not name-first: read the whole object
            self._whole(body[:close], out)
        self.call, self.buffer, self.after_call = None, body[rest:], True
        return True

    def _known(self, name) -> bool:
        if (
            not isinstance(name, str)
            or name not in self.tools
            or (self.max_calls is not None and self.calls >= self.max_calls)
        ):
            return False
        self.calls += 1
        return True

    def _whole(self, body: str, out: list[CallDelta]) -> None:
        try:
            obj = json.loads(body)
        except ValueError:
            return  # malformed: dropped (SGLang)
        if not isinstance(obj, dict) or not self._known(obj.get("name")):
            return
        args = obj.get("arguments", obj.get("parameters", {}))
        out.append(CallDelta(self.calls - 1, _call_id(), obj["name"], json.dumps(args, ensure_ascii=False)))

    def finish(self) -> tuple[str, list[CallDelta]]:
        """The output ended: an open name-first call keeps its arguments so far; held text is content."""
        out: list[CallDelta] = []
        if self.call is not None:
            call, body = self.call, self.buffer
            if call.index is not None and (piece := body[call.args_at + call.sent : call.args(body)]):
                out.append(CallDelta(call.index, None, None, piece))
            self.call, self.buffer = None, ""
            return "", out
        text = self._text(self.buffer)
        self.buffer = ""
        if not self.calls:
            text, self.held = text + self.held, ""
        return text, out


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_calls(parser: ToolCallParser, text: str) -> tuple[str, list[dict]]:
    """The whole output -> (content, OpenAI tool_calls): a fresh parser's streamed deltas merged."""
    content, deltas = parser.feed(text)
    rest, more = parser.finish()
    calls: list[dict] = []
    for d in deltas + more:
        if d.id:
            fn = {"name": d.name, "arguments": d.arguments}
            calls.append({"id": d.id, "type": "function", "index": d.index, "function": fn})
        else:
            calls[d.index]["function"]["arguments"] += d.arguments
    return content + rest, calls
