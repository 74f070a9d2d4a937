"""`/v1/chat/completions`: the prompt through the chat template (with the request's tools; `/tokenize` uses it
too); the reply split into reasoning (`--reasoning-parser`), content and tool calls (`--tool-call-parser`),
whole and streamed; OpenAI's chat logprobs."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from gleanrl.server.http.edge.body import parse
from gleanrl.server.http.edge.errors import ApiError, bad_field
from gleanrl.server.http.edge.limits import encode
from gleanrl.server.http.generate.detok import Delta, output_text
from gleanrl.server.http.generate.fanin import Track
from gleanrl.server.http.generate.grammar import after_reasoning, grammar_source, reasoning_mode, response_format_source
from gleanrl.server.http.generate.params import check_prompt
from gleanrl.server.http.generate.reasoning import THINK, ReasoningParser
from gleanrl.server.http.openai.serve import ChatIn, ChatMessage, chat_logprobs, finish_of, serve, to_sampling
from gleanrl.server.http.openai.tool_parser import ToolCallParser, parse_calls
from gleanrl.server.http.openai.tools import forcing_grammar, history, plan_tools

router = APIRouter()


def _messages(raw: list[ChatMessage]) -> list[dict]:
    """Pydantic chat messages -> the template's dicts (text parts joined; tool calls and answers kept)."""
    messages = []
    for k, m in enumerate(raw):
        content = m.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise bad_field(f"messages.{k}.content", "only text parts are supported")
            content = "".join(str(part.get("text", "")) for part in content)
        extra = {key: v for key in ("tool_calls", "tool_call_id", "name") if (v := getattr(m, key)) is not None}
        messages.append({"role": m.role, "content": content or "", **extra})
    return history(messages)


async def chat_text(
    state,
    raw: list[ChatMessage],
    template_kwargs: dict | None = None,
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
) -> str:
    """The prompt's text; a 400 when there is no template or it rejects the messages."""
    messages = _messages(raw)
    kwargs = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
    try:
        return await asyncio.to_thread(
            state.tokenizer.apply_chat_template,
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except Exception as exc:  # no template, or the template rejects these messages
        raise ApiError(400, f"messages: the chat template failed: {exc}", param="messages") from None


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state = request.app.state
    body = await parse(request, ChatIn)
    extra = body.model_extra or {}
    constrained = bool(grammar_source(extra) or response_format_source(extra.get("response_format")))
    # the tools' schemas are checked by xgrammar: off the event loop
    tools = await asyncio.to_thread(plan_tools, body, state.server_cfg.tool_call_parser, constrained)
    text = await chat_text(state, body.messages, body.chat_template_kwargs, tools=tools.template_tools)
    (prompt,) = await encode(state, [text], add_special_tokens=False)
    check_prompt(state, prompt, "messages")
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if limit is None:
        cap = state.server_cfg.max_new_tokens_cap
        limit = state.context_length - len(prompt) if cap is None else min(state.context_length - len(prompt), cap)
    params, spec = to_sampling(state, body, limit)
    opened = text.rstrip().endswith(THINK)  # the template opened the block (SGLang's force)
    # a reasoning model reasons first, then the grammar holds the answer or the calls (SGLang)
    reasoning = reasoning_mode(state.server_cfg.reasoning_parser, opened)
    if tools.forced:
        spec = forcing_grammar(tools, state.server_cfg, reasoning)
    else:
        spec = await after_reasoning(state, spec, reasoning)
    tok = state.tokenizer
    # tool-call markup may be special tokens: kept for the parser (SGLang)
    skip_special = body.skip_special_tokens and tools.parser is None
    callers = (
        [ToolCallParser(tools.parser, tools.names, tools.max_calls) for _ in range(params.n)] if tools.parser else None
    )
    called = [False] * params.n
    k = (body.top_logprobs or 0) if body.logprobs else 0
    reported = [0] * params.n
    name = state.server_cfg.reasoning_parser if body.separate_reasoning else None
    parsers = [ReasoningParser(name, opened) for _ in range(params.n)] if name else None
    held = [""] * params.n  # stream_reasoning off: reasoning held to its end

    def split(i: int, text: str, finished: bool) -> tuple[str, str]:
        """A streamed delta -> (reasoning, content) to send now."""
        if parsers is None:
            return "", text
        reasoning, content = parsers[i].feed(text)
        if finished:
            rest = parsers[i].finish()
            reasoning, content = reasoning + rest[0], content + rest[1]
        if not body.stream_reasoning:
            held[i] += reasoning
            reasoning = ""
            if finished or not parsers[i].in_reasoning:
                reasoning, held[i] = held[i], ""
        return reasoning, content

    def calls(i: int, text: str, finished: bool) -> tuple[str, list[dict]]:
        """Streamed content -> (content, tool_calls deltas) to send now."""
        if callers is None:
            return text, []
        text, deltas = callers[i].feed(text)
        if finished:
            rest, more = callers[i].finish()
            text, deltas = text + rest, deltas + more
        called[i] = called[i] or bool(deltas)
        return text, [d.as_dict() for d in deltas]

    def finish(reason, matched, made_calls: bool):
        """A natural stop after tool calls is finish_reason tool_calls (SGLang)."""
        return ("tool_calls", None) if made_calls and reason == "stop" else (reason, matched)

    def render(i: int, track: Track, delta: Delta | None) -> dict | None:
        text = output_text(tok, track, skip_special, body.no_stop_trim)
        reason, matched = finish_of(track)
        if delta is None:
            reasoning, text = parsers[i].split(text) if parsers else ("", text)
            text, tool_calls = parse_calls(callers[i], text) if callers else (text, [])
            reason, matched = finish(reason, matched, bool(tool_calls))
            logprobs = chat_logprobs(tok, track, k) if body.logprobs else None
            message = {"role": "assistant", "content": text or (None if tool_calls else "")}
            message |= {"reasoning_content": reasoning or None, "tool_calls": tool_calls or None}
            choice = {"index": i, "message": message, "logprobs": logprobs}
            return choice | {"finish_reason": reason, "matched_stop": matched}
        reasoning, text = split(i, delta(text, track.finished), track.finished)
        text, tool_calls = calls(i, text, track.finished)
        if not text and not reasoning and not tool_calls and reason is None:
            return None
        reason, matched = finish(reason, matched, called[i])
        logprobs = chat_logprobs(tok, track, k, start=reported[i]) if body.logprobs else None
        reported[i] = len(track.ids)
        out = {k: v for k, v in (("reasoning_content", reasoning), ("content", text), ("tool_calls", tool_calls)) if v}
        return {"index": i, "delta": out, "logprobs": logprobs, "finish_reason": reason, "matched_stop": matched}

    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise ApiError(400, f"top_logprobs must be in [0, 20], got {body.top_logprobs}", param="top_logprobs")
    return await serve(request, body, [prompt], params, spec, body.logprobs, "chat", render, {"top_logprobs_num": k})
