"""Tool-call parsers: a model's tool calls apart from its text, for the formats SGLang 0.5.23's
`--tool-call-parser` names (`function_call/*_detector.py`), one-shot and streamed.

- `qwen25` (alias `qwen`) and `hermes`: each call is `<tool_call>{"name": …, "arguments": …}
  </tool_call>` (Qwen 2.5 / 3 put newlines inside the tags; either way is read).
- `llama3`: `<|python_tag|>{"name": …, "parameters": …}` (or `"arguments"`), or a bare JSON object
  that opens the output; several calls are separated by `;`.

One parser for both paths: the reply is the streamed deltas merged (`parse`), so a streamed reply
and a whole one are the same whatever the chunking. Differences from SGLang, on purpose: `arguments`
is the JSON text the model wrote (valid JSON; SGLang re-serialises it), streamed as it arrives; text
outside the calls is `content` in both paths (SGLang's whole-reply path keeps only the text before the
first call); whitespace between or after calls is dropped. As SGLang: a call to a function not in
`tools` is dropped; a call cut off by the length limit keeps what was written."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

# name first, then the arguments (the streamed path); any other order is read when the call ends
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass(frozen=True, slots=True)
class Format:
    start: str              # opens a call
    end: str | None         # closes it (None: the JSON object's end)
    separator: str          # between calls (dropped)
    bare_first: bool        # a JSON object that opens the output is a call too
    begin: str              # the grammar's text before the arguments ({name} filled in)
    close: str              # ... and after them


QWEN25 = Format("<tool_call>", "</tool_call>", "\n", False,
                '<tool_call>\n{{"name":"{name}", "arguments":', "}\n</tool_call>")
HERMES = Format("<tool_call>", "</tool_call>", "\n", False,
                '<tool_call>{{"name":"{name}", "arguments":', "}</tool_call>")
LLAMA3 = Format("<|python_tag|>", None, ";", True,
                '<|python_tag|>{{"name":"{name}", "arguments":', "}")
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


def json_end(text: str, start: int) -> int | None:
    """End of the JSON object or array that starts at text[start] (after whitespace), None while
    it is still open (or when no object starts there)."""
    depth, in_str, esc = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            esc, in_str = (False, True) if esc else (c == "\\", c != '"')
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and not c.isspace():
            return None                        # a scalar: read when the call ends
    return None


def _partial(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a strict prefix of `tag`."""
    for i in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-i:]):
            return i
    return 0


class ToolCallParser:
    def __init__(self, name: str, tools: list[str], max_calls: int | None = None):
        """`tools`: the function names that may be called; `max_calls`: 1 without
        parallel_tool_calls (later calls are dropped)."""
        self.fmt, self.tools, self.max_calls = FORMATS[name], set(tools), max_calls
        self.buffer = ""             # unread text outside a call, or the open call's body
        self.calls, self.held = 0, ""
        self.started = False         # anything but whitespace seen (a bare call opens the output)
        self.after_call = False      # only whitespace since the last call closed
        self.call: list | None = None  # the open call: [index or None (dropped), args at, sent]

    def _open(self, body: str) -> None:
        self.call, self.buffer, self.started, self.held = [None, None, 0], body, True, ""

    def _text(self, text: str) -> str:
        """Text outside calls; once a call was made, trailing whitespace is held until more
        text follows (dropped before a call and at the end)."""
        text, self.held = self.held + text, ""
        if self.calls:
            body = text.rstrip()
            text, self.held = body, text[len(body):]
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
                    return content, out            # a separator may follow
                if text.lstrip().startswith(fmt.separator):
                    text = self.buffer = text.lstrip()[len(fmt.separator):]
                    if not text.strip():
                        return content, out        # the next call may follow
            if fmt.bare_first and (not self.started or self.after_call):
                if text.lstrip().startswith("{"):
                    self._open(text)
                    continue
                if not self.started and not text.strip():
                    return content, out            # only whitespace: a call may follow
            pos = text.find(fmt.start)
            if pos >= 0:
                content += self._text(text[:pos])
                self._open(text[pos + len(fmt.start):])
                continue
            hold = _partial(text, fmt.start)
            content += self._text(text[:len(text) - hold])
            self.buffer = text[len(text) - hold:] if hold else ""
            return content, out

    def _read_call(self, out: list[CallDelta]) -> bool:
        """Advance the open call; True when it closed (the buffer then holds what follows)."""
        body, call, fmt = self.buffer, self.call, self.fmt
        if call[1] is None and (m := _HEAD.match(body)) and body[m.end():][:1] in ("{", "["):
            call[1] = m.end()
            if self._known(m.group(1)):
                call[0] = self.calls - 1
                out.append(CallDelta(call[0], _call_id(), m.group(1), ""))
        if fmt.end is None:
            close = rest = json_end(body, 0)
        else:
            pos = body.find(fmt.end)
            close, rest = (pos, pos + len(fmt.end)) if pos >= 0 else (None, None)
        if call[0] is not None:                    # stream the arguments' text as it comes
            stop = json_end(body, call[1])
            if stop is None:
                stop = close if close is not None else len(body) - (
                    _partial(body, fmt.end) if fmt.end else 0)
            piece = body[call[1] + call[2]:stop]
            if piece:
                call[2] += len(piece)
                out.append(CallDelta(call[0], None, None, piece))
        if close is None:
            return False
        if call[1] is None:                        # not name-first: read the whole object
            self._whole(body[:close], out)
        self.call, self.buffer, self.after_call = None, body[rest:], True
        return True

    def _known(self, name) -> bool:
        if name not in self.tools or (self.max_calls is not None and self.calls >= self.max_calls):
            return False
        self.calls += 1
        return True

    def _whole(self, body: str, out: list[CallDelta]) -> None:
        try:
            obj = json.loads(body)
        except ValueError:
            return                                 # malformed: dropped (SGLang)
        if not isinstance(obj, dict) or not self._known(obj.get("name")):
            return
        args = obj.get("arguments", obj.get("parameters", {}))
        out.append(CallDelta(self.calls - 1, _call_id(), obj["name"],
                             json.dumps(args, ensure_ascii=False)))

    def finish(self) -> tuple[str, list[CallDelta]]:
        """The output ended: a call still open keeps the arguments written so far (if it was
        name-first); text held back as a possible tag start is content."""
        out: list[CallDelta] = []
        if self.call is not None:
            call, body = self.call, self.buffer
            piece = body[call[1] + call[2]:json_end(body, call[1] or 0)] if call[1] else ""
            if call[0] is not None and piece:
                out.append(CallDelta(call[0], None, None, piece))
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
            calls.append({"id": d.id, "type": "function", "index": d.index,
                          "function": {"name": d.name, "arguments": d.arguments}})
        else:
            calls[d.index]["function"]["arguments"] += d.arguments
    return content + rest, calls
