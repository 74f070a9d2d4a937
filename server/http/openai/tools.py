"""Tool calls on the chat route, the request side: `tools`, `tool_choice`, `parallel_tool_calls` checked, what the chat
template gets, and the grammar that enforces `tool_choice` required / named. As SGLang 0.5.23: the template gets the
tools unless tool_choice is none (a named one: that function only); the output is parsed by `--tool-call-parser` unless
tool_choice is none or another grammar holds it; required / named is a structural tag in the parser's format with at
least one call, after the reasoning. Unlike SGLang: the arguments follow the function's `parameters` schema (SGLang only
with `strict`; vLLM always), and the output is the calls alone (SGLang lets text follow them)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gleanrl.server.http.edge.errors import bad_field
from gleanrl.server.http.generate.grammar import MAX_GRAMMAR_BYTES, after_think, xgrammar
from gleanrl.server.http.openai.tool_parser import FORMATS


@dataclass(frozen=True, slots=True)
class ToolPlan:
    template_tools: list[dict] | None  # for apply_chat_template(tools=...)
    names: list[str]  # the functions the parser may return
    parser: str | None  # the --tool-call-parser that reads the output, if any
    forced: bool  # tool_choice required / named (`forcing_grammar`)
    max_calls: int | None  # 1 when parallel_tool_calls is false


def _check_tools(tools) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_field("tools", "must be a list of tools")
    xgr = xgrammar()
    for k, tool in enumerate(tools):
        field = f"tools.{k}"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise bad_field(f"{field}.type", "only function tools are supported")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad_field(f"{field}.function", "an object with a name is required")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_field(f"{field}.function.name", "a non-empty string is required")
        params = fn.get("parameters")
        if params is not None:
            if not isinstance(params, dict):
                raise bad_field(f"{field}.function.parameters", "must be a JSON schema object")
            try:  # converts the schema to a grammar (no token masks): cheap, and strict
                xgr.Grammar.from_json_schema(json.dumps(params))
            except Exception as exc:
                raise bad_field(
                    f"{field}.function.parameters", f"invalid JSON schema: {str(exc).strip()[-200:]}"
                ) from None
    return tools


def _check_choice(choice, names: list[str]) -> str | None:
    """'auto' | 'none' | 'required', or the named function's name."""
    if choice is None:
        return "auto" if names else "none"
    if choice in ("auto", "none", "required"):
        if choice == "required" and not names:
            raise bad_field("tool_choice", "Tools cannot be empty if tool choice is set to required.")
        return choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(fn, dict) or choice.get("type", "function") != "function":
        raise bad_field(
            "tool_choice", 'must be auto, none, required or {"type": "function", "function": {"name": ...}}'
        )
    if fn.get("name") not in names:
        raise bad_field("tool_choice.function.name", f"Tool {fn.get('name')!r} not found in tools list.")
    return fn["name"]


def plan_tools(body, parser: str | None, constrained: bool) -> ToolPlan:
    """Tool fields -> what template, parser and engine get (`constrained`: another grammar holds the output)."""
    extra = body.model_extra or {}
    tools = _check_tools(extra.get("tools"))
    names = [t["function"]["name"] for t in tools]
    choice = _check_choice(extra.get("tool_choice"), names)
    parallel = extra.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_field("parallel_tool_calls", "must be a boolean")
    if choice == "none" or not tools:
        return ToolPlan(None, [], None, False, None)
    forced = choice not in ("auto", "none")
    if forced and parser is None:
        raise bad_field("tool_choice", "required or a named tool needs the server started with --tool-call-parser")
    if forced and constrained:
        raise bad_field(
            "tool_choice",
            "tool_choice 'required' or a named tool cannot be combined with response_format, regex, or ebnf",
        )
    if choice not in ("auto", "required"):
        tools, names = [t for t in tools if t["function"]["name"] == choice], [choice]
    max_calls = 1 if parallel is False else None
    return ToolPlan(tools, names, None if constrained else parser, forced, max_calls)


def forcing_grammar(plan: ToolPlan, cfg, reasoning: str | None = None) -> tuple[str, str, str]:
    """xgrammar's structural tag for a forced choice: calls in the parser's format (one only without
    parallel_tool_calls) with arguments valid for their schema, after the reasoning (`reasoning_mode`'s)."""
    fmt, tools, max_calls = FORMATS[plan.parser], plan.template_tools, plan.max_calls
    spaces = cfg.constrained_json_max_whitespace_cnt or (1 if cfg.constrained_json_disable_any_whitespace else None)
    tags = []
    for tool in tools:
        fn = tool["function"]
        content = {
            "type": "json_schema",
            "json_schema": fn.get("parameters") or {"type": "object"},
            **({"max_whitespace_cnt": spaces} if spaces else {}),
        }
        tags.append({"type": "tag", "begin": fmt.begin.format(name=fn["name"]), "content": content, "end": fmt.close})
    calls = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": fmt.separator,
        "at_least_one": True,
        "stop_after_first": max_calls == 1,
    }
    if reasoning is not None:
        calls = after_think(calls, reasoning, gap=r"\s*")
    source = json.dumps({"type": "structural_tag", "format": calls})
    if len(source) > 4 * MAX_GRAMMAR_BYTES:
        raise bad_field(
            "tools", f"the tools' grammar holds {len(source)} bytes, over the limit of {4 * MAX_GRAMMAR_BYTES}"
        )
    return "structural_tag", source, "tools"


def history(messages: list[dict]) -> list[dict]:
    """History `tool_calls` with `arguments` as objects (SGLang's normalize_assistant_tool_call_arguments)."""
    for k, m in enumerate(messages):
        for j, call in enumerate(m.get("tool_calls") or []):
            field = f"messages.{k}.tool_calls.{j}.function"
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad_field(field, "an object with a name is required")
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except ValueError:
                    args = None
            if not isinstance(args, dict):
                raise bad_field(f"{field}.arguments", "must be a JSON object (as a string)")
            call["function"] = {**fn, "arguments": args}
    return messages
