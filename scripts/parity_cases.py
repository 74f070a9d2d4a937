"""The cases of scripts/parity_sglang.py: each one's request (the same on both servers), its
validity check, the server pair (flags) it runs on, the note on why outputs differ where they do,
and `compare`, which makes a case's record from both outputs."""

from __future__ import annotations

import json
import re

import httpx


def _object(**properties) -> dict:
    """A JSON schema: an object of exactly these properties, all required."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
PERSON = _object(city={"enum": ["Paris", "Rome"]}, n=DIGIT, ok={"type": "boolean"})
REGEX = r"(yes|no), [0-9]{1,3} (apples|pears)\."
EBNF = 'root ::= num (op num)? (op num)? "."\nop ::= " + " | " * "\nnum ::= [1-9] [0-9]?'
EBNF_RE = r"[1-9][0-9]?(( \+ | \* )[1-9][0-9]?){0,2}\."
CITY, SUM = _object(city={"enum": ["Paris", "Rome"]}), _object(a=DIGIT)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "add", "description": "add", "parameters": SUM}},
]
STRICT = [{"type": "function", "function": {**t["function"], "strict": True}} for t in TOOLS]
ANSWER_RE = r"(yes|no)\."  # held after the reasoning (both servers: the token after </think>)
THINK_END_ID = 385  # `</think>` in the model's vocabulary (parity_sglang.make_model checks it)


PROMPT = "Question: what is 12 + 30? Answer:"
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
ASK_JSON = [{"role": "user", "content": "Give me a city as JSON."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def _person(out: dict) -> tuple[bool, str]:
    try:
        v = json.loads(text_of(out))
    except (json.JSONDecodeError, TypeError) as exc:
        return False, f"not JSON: {exc}"
    ok = (
        isinstance(v, dict)
        and set(v) == {"city", "n", "ok"}
        and v["city"] in ("Paris", "Rome")
        and type(v["n"]) is int
        and 0 <= v["n"] <= 9
        and isinstance(v["ok"], bool)
    )
    return ok, "" if ok else f"does not fit the schema: {v!r}"


def _valid_regex(pattern: str):
    def check(out: dict) -> tuple[bool, str]:
        text = text_of(out)
        ok = text is not None and re.fullmatch(pattern, text) is not None
        return ok, "" if ok else f"{text!r} does not match {pattern!r}"

    return check


def _valid_tool(out: dict) -> tuple[bool, str]:
    calls = out.get("tool_calls") or []
    if len(calls) != 1 or calls[0]["name"] != "get_weather":
        return False, f"calls {calls!r}"
    try:
        args = json.loads(calls[0]["arguments"])
    except json.JSONDecodeError as exc:
        return False, f"arguments not JSON: {exc}"
    ok = args in ({"city": "Paris"}, {"city": "Rome"})
    return ok, "" if ok else f"arguments {args!r}"


def _valid_reasoning(answered: bool):
    def check(out: dict) -> tuple[bool, str]:
        r, c = out.get("reasoning_content"), out.get("content")
        if answered:  # free reasoning, then </think> (biased) and the answer as ANSWER_RE says
            ok = bool(r) and re.fullmatch(ANSWER_RE, c or "") is not None
        else:  # no </think>: all of it is reasoning
            ok = isinstance(r, str) and bool(r) and not c
        return ok, "" if ok else f"split {r!r} / {c!r}"

    return check


def _valid_after_think(out: dict) -> tuple[bool, str]:
    """/generate with require_reasoning: free text, </think>, then the answer as ANSWER_RE says."""
    reasoning, sep, answer = (out.get("text") or "").partition("</think>")
    ok = bool(reasoning) and bool(sep) and re.fullmatch(ANSWER_RE, answer) is not None
    return ok, "" if ok else f"split {reasoning!r} / {answer!r}"


def _generate(url: str, body_params: dict, max_new: int, **top) -> dict:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, **body_params}, **top}
    r = httpx.post(f"{url}/generate", json=body, timeout=300)
    if r.status_code != 200:
        return {"error": f"{r.status_code} {r.text[:300]}"}
    j = r.json()
    finish = (j["meta_info"].get("finish_reason") or {}).get("type")
    return {"text": j["text"], "finish_reason": finish, "tokens": j["meta_info"].get("completion_tokens")}


def _chat(url: str, **kw) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    try:
        ch = client.chat.completions.create(model="m", temperature=0, logprobs=True, **kw).choices[0]
    except openai.APIError as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    msg = ch.message
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in (msg.tool_calls or [])]
    # the raw output (markup included), from the tokens' logprob entries
    raw = "".join(t.token for t in ch.logprobs.content) if ch.logprobs else None
    out = {"content": msg.content, "finish_reason": ch.finish_reason, "raw": raw}
    if calls:
        out["tool_calls"] = calls
    rc = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
    if rc is not None:
        out["reasoning_content"] = rc
    return out


def _named_tool(url: str, tools: list) -> dict:
    """A forced call of get_weather (the parser's markup, the arguments by the function's schema)."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    return _chat(url, messages=MSGS, tools=tools, parallel_tool_calls=False, max_tokens=160, tool_choice=choice)


def _end_think(bias: float) -> dict:
    """A logit bias on </think>, which a random model never writes by itself: chosen per prompt
    so that it ends the reasoning after some tokens, within the length limit."""
    return {str(THINK_END_ID): bias}


def text_of(out: dict) -> str:
    return out.get("text", out.get("content"))


# name -> (server pair, request function (url) -> output dict, validity check (output) -> (ok, why))
CASES: dict[str, tuple] = {
    "plain_generate": ("defaults", lambda u: _generate(u, {}, 12), lambda o: (True, "")),
    "json_native_any_ws": ("defaults", lambda u: _generate(u, {"json_schema": json.dumps(PERSON)}, 48), _person),
    "json_native": ("tools", lambda u: _generate(u, {"json_schema": json.dumps(PERSON)}, 48), _person),
    "json_response_format": (
        "tools",
        lambda u: _chat(u, messages=ASK_JSON, max_tokens=48, response_format=FORMAT),
        _person,
    ),
    "regex": ("tools", lambda u: _generate(u, {"regex": REGEX}, 24), _valid_regex(REGEX)),
    "ebnf": ("tools", lambda u: _generate(u, {"ebnf": EBNF}, 24), _valid_regex(EBNF_RE)),
    "tool_named": ("tools", lambda u: _named_tool(u, TOOLS), _valid_tool),
    "tool_named_strict": ("tools", lambda u: _named_tool(u, STRICT), _valid_tool),
    "tool_named_strict_any_ws": ("defaults", lambda u: _named_tool(u, STRICT), _valid_tool),
    "reasoning_plain": ("reasoning", lambda u: _chat(u, messages=MSGS, max_tokens=16), _valid_reasoning(False)),
    "reasoning_regex": (
        "reasoning",
        lambda u: _chat(u, messages=MSGS, max_tokens=40, logit_bias=_end_think(2.0), extra_body={"regex": ANSWER_RE}),
        _valid_reasoning(True),
    ),
    "reasoning_generate": (
        "reasoning",
        lambda u: _generate(u, {"regex": ANSWER_RE, "logit_bias": _end_think(2.5)}, 40, require_reasoning=True),
        _valid_after_think,
    ),
}
# the same flags on both servers; JSON whitespace: both default to any whitespace (xgrammar's
# any_whitespace), which a random model fills until the length limit, so the pair that runs the
# structured cases disables it on both (`--constrained-json-disable-any-whitespace`, a flag of both)
PAIRS = {
    "defaults": ["--tool-call-parser", "qwen25"],
    "tools": ["--tool-call-parser", "qwen25", "--constrained-json-disable-any-whitespace"],
    "reasoning": ["--reasoning-parser", "deepseek-r1"],
}


NOTES = {  # why outputs differ (or fail) where they do, found in the measured run (docs/parity.md)
    "plain_generate": "baseline: same tokens, logprobs equal to 4 decimals (both float32)",
    "json_native_any_ws": "both default to any whitespace (xgrammar `any_whitespace`); the random model fills it "
    "until the length limit on both, token for token",
    "tool_named": "SGLang constrains a named call's arguments only with `strict`: here any JSON value (a number that "
    "never ends), cut at the limit, no call parsed; gleanrl holds them to `parameters` (tools.py)",
    "tool_named_strict": "same call markup on both; SGLang's structural tag ignores "
    "`--constrained-json-disable-any-whitespace` (any whitespace: `\\t` until the limit), gleanrl's allows at most "
    "one whitespace character there",
    "tool_named_strict_any_ws": "both fill the arguments' whitespace until the limit (same tokens); at the cut "
    "gleanrl returns the unfinished call, SGLang no call and empty content",
    "reasoning_regex": "both hold the regex only after `</think>` (a logit bias on it ends the random model's "
    "reasoning)",
    "reasoning_generate": "`require_reasoning: true` on /generate: the reasoning forced from the first token, the "
    "regex after `</think>`",
}


def compare(name: str, ours: dict, theirs: dict, check) -> dict:
    ok_g, why_g = (False, ours["error"]) if "error" in ours else check(ours)
    ok_s, why_s = (False, theirs["error"]) if "error" in theirs else check(theirs)
    strip = {"finish_reason", "tokens", "raw"}
    same = {k: v for k, v in ours.items() if k not in strip} == {k: v for k, v in theirs.items() if k not in strip}
    raw = ours.get("raw"), theirs.get("raw")  # chat: the output before the parsers
    record = {"case": name, "identical": same, "raw_identical": None if None in raw else raw[0] == raw[1]}
    record |= {"gleanrl_valid": ok_g, "sglang_valid": ok_s, "gleanrl": ours, "sglang": theirs}
    return record | {"gleanrl_why": why_g, "sglang_why": why_s, "note": NOTES.get(name, "")}
