"""OpenAI-compatible API: /v1/models, /v1/completions, /v1/chat/completions (streaming and not),
with usage, finish_reason (plus SGLang's `matched_stop`), logprobs of the sampled tokens, and errors
in OpenAI's shape. Chat prompts go through the tokenizer's chat template (with the request's tools,
`server.http.tools`); the reply's text is split into reasoning (`server.http.reasoning`), content
and tool calls (`server.http.tool_parser`), in the reply and in streamed deltas."""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Request

from gleanrl.server.http.detok import Delta, output_text
from gleanrl.server.http.fanin import Track, collect
from gleanrl.server.http.generate import (
    answer_bytes,
    check_length,
    check_prompt,
    expand,
    sampling,
    start_run,
    stream,
    with_grammar,
)
from gleanrl.server.http.grammar import after_reasoning, grammar_source, reasoning_mode, response_format_source
from gleanrl.server.http.limits import check_batch, check_serving, check_top_logprobs, encode
from gleanrl.server.http.openai_logprobs import chat_logprobs, completion_logprobs
from gleanrl.server.http.reasoning import THINK, ReasoningParser, check_parser
from gleanrl.server.http.render import json_response
from gleanrl.server.http.schemas import (
    TOOL_FIELDS,
    UNSUPPORTED_OPENAI,
    ApiError,
    ChatIn,
    ChatMessage,
    CompletionIn,
    OpenAISampling,
    SeparateReasoningIn,
    off_loop,
    parse,
    refuse_unsupported,
)
from gleanrl.server.http.tool_parser import ToolCallParser, parse_calls
from gleanrl.server.http.tools import ToolPlan, forcing_grammar, history, plan_tools

router = APIRouter()


def _card(state) -> dict:
    name = state.served_model_name
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "gleanrl",
        "root": name,
        "max_model_len": state.context_length,
    }


@router.get("/v1/models")
async def models(request: Request):
    return {"object": "list", "data": [_card(request.app.state)]}


@router.get("/v1/models/{model:path}")
async def model(model: str, request: Request):
    _check_model(request.app.state, model)
    return _card(request.app.state)


def _check_model(state, name: str | None) -> None:
    """/v1/models/{model}: the served name only (SGLang). The generation routes take any `model`
    (clients send their own names; SGLang serves them) and echo it in the reply."""
    if name not in (None, "default", state.served_model_name, state.engine.info().get("model_path")):
        raise ApiError(404, f"The model '{name}' does not exist", param="model", code="model_not_found")


def _params(state, body: OpenAISampling, max_tokens: int | None):
    sp = {
        "max_new_tokens": max_tokens,
        "n": body.n,
        "stop": [body.stop] if isinstance(body.stop, str) else body.stop,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "ignore_eos": body.ignore_eos,
        "stop_token_ids": body.stop_token_ids,
        "seed": body.seed,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "repetition_penalty": body.repetition_penalty,
        "min_new_tokens": body.min_tokens,
        "logit_bias": body.logit_bias,
        "stop_regex": body.stop_regex,
    }
    extra = body.model_extra or {}
    refuse_unsupported(extra, UNSUPPORTED_OPENAI)
    spec = grammar_source(extra)
    fmt = response_format_source(extra.get("response_format"))
    if spec and fmt:
        raise ApiError(400, f"{spec[2]}: response_format already constrains the output", param=spec[2])
    try:
        return sampling(state, sp, field=""), spec or fmt
    except ApiError as exc:  # name OpenAI's fields, not SGLang's
        for name in ("message", "param"):
            text = (getattr(exc, name) or "").lstrip(".").replace("max_new_tokens", "max_tokens")
            setattr(exc, name, text.replace("min_new_tokens", "min_tokens"))
        raise


def _finish(track: Track) -> tuple[str | None, int | str | None]:
    reason = track.finish_reason
    return (reason["type"], reason.get("matched")) if reason else (None, None)


def _usage(tracks: list[Track], n: int) -> dict:
    prompt = sum(len(t.req.input_ids) for t in tracks[::n])
    completion = sum(len(t.ids) for t in tracks)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _serve(
    request: Request,
    body: OpenAISampling,
    prompts: list[list[int]],
    params,
    spec,
    logprob: bool,
    kind: str,
    render,
    options: dict | None = None,
):
    """Shared by both endpoints: run, then answer as one JSON object or as an SSE stream of chunks.
    `options`: GenerateRequest's logprob fields (top_logprobs_num, logprob_start_len)."""
    state = request.app.state
    check_serving(state)
    params = await with_grammar(state, params, spec)
    if not isinstance(body, ChatIn) or body.max_tokens is not None or body.max_completion_tokens is not None:
        for ids in prompts:  # an explicit limit that does not fit: SGLang's 400
            check_length(state, ids, params, "prompt" if kind != "chat" else "messages")
    # SGLang's rid extension: one prompt only
    rids = [body.rid] if len(prompts) == 1 else [None] * len(prompts)
    reqs, groups = expand(
        prompts, [params] * len(prompts), rids, [logprob] * len(prompts), [options or {}] * len(prompts)
    )
    run = await start_run(state, reqs, groups)
    head = {
        "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": body.model or state.served_model_name,
    }
    if not body.stream:
        tracks = await collect(run, request)
        if tracks is None:
            return None

        def answer():
            return json_response(
                {
                    **head,
                    "object": "chat.completion" if kind == "chat" else "text_completion",
                    "choices": [render(i, t, None) for i, t in enumerate(tracks)],
                    "usage": _usage(tracks, params.n),
                }
            )

        return await off_loop(answer, answer_bytes(tracks))  # logprobs: megabytes, as /generate's
    deltas = [Delta(params.stop) for _ in reqs]
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    started: set[int] = set()

    def chunks(i: int) -> list[dict]:
        track, out = run.tracks[i], []
        if kind == "chat" and i not in started:
            started.add(i)
            out.append(
                {
                    **head,
                    "object": obj,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
        choice = render(i, track, deltas[i])
        if choice is not None:
            out.append({**head, "object": obj, "choices": [choice]})
        return out

    def tail() -> list[dict]:
        if not (body.stream_options and body.stream_options.include_usage):
            return []
        return [{**head, "object": obj, "choices": [], "usage": _usage(run.tracks, params.n)}]

    return await stream(run, request, chunks, tail)


@router.post("/v1/completions")
async def completions(request: Request):
    state = request.app.state
    body = await parse(request, CompletionIn, state.server_cfg.max_request_bytes)
    refuse_unsupported(body.model_extra or {}, TOOL_FIELDS)  # the chat route's (SGLang)
    if body.logprobs is not None:
        check_top_logprobs(state, body.logprobs, "logprobs")
    raw = body.prompt
    if isinstance(raw, str) or (raw and isinstance(raw[0], int)):
        raw = [raw]
    if not raw:
        raise ApiError(400, "prompt: must not be empty", param="prompt")
    # OpenAI's default
    params, spec = _params(state, body, 16 if body.max_tokens is None else body.max_tokens)
    check_batch(state, len(raw) * params.n, "prompt")
    texts = iter(await encode(state, [p for p in raw if isinstance(p, str)]))
    prompts = [check_prompt(state, next(texts) if isinstance(p, str) else p, "prompt") for p in raw]
    tok = state.tokenizer
    k = body.logprobs or 0
    # output tokens whose logprobs a stream chunk carried
    reported = [0] * (len(prompts) * params.n)
    echoed: set[int] = set()

    def render(i: int, track: Track, delta: Delta | None) -> dict | None:
        text = output_text(tok, track, body.skip_special_tokens, body.no_stop_trim)
        reason, matched = _finish(track)
        if delta is not None:
            text = delta(text, track.finished)
            if not text and reason is None:
                return None
        # a stream echoes the prompt in its first chunk (SGLang)
        first = delta is None or i not in echoed
        echoed.add(i)
        if body.echo and first:
            p = raw[i // params.n]
            text = (p if isinstance(p, str) else tok.decode(p)) + text
        logprobs = None
        if body.logprobs is not None:
            logprobs = completion_logprobs(tok, track, k, echo=body.echo and first, start=reported[i])
            reported[i] = len(track.ids) if delta is not None else 0
        return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason, "matched_stop": matched}

    options = {"top_logprobs_num": k, "logprob_start_len": 0 if body.echo and k else -1}
    return await _serve(request, body, prompts, params, spec, body.logprobs is not None, "completion", render, options)


def _messages(raw: list[ChatMessage]) -> list[dict]:
    """Pydantic chat messages -> the template's dicts (text parts joined; tool calls and tool
    answers kept)."""
    messages = []
    for k, m in enumerate(raw):
        content = m.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                field = f"messages.{k}.content"
                raise ApiError(400, f"{field}: only text parts are supported", param=field)
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
    """The chat template over the messages and tools (in a worker thread: a large body must not
    block the event loop); 400 when there is no template or it rejects the messages."""
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


async def _chat_prompt(state, body: ChatIn, tools: ToolPlan) -> tuple[list[int], str]:
    text = await chat_text(state, body.messages, body.chat_template_kwargs, tools=tools.template_tools)
    (ids,) = await encode(state, [text], add_special_tokens=False)
    return check_prompt(state, ids, "messages"), text


@router.post("/separate_reasoning")
async def separate_reasoning(request: Request):
    """SGLang's native route: `text` split by the parser the body names."""
    state = request.app.state
    body = await parse(request, SeparateReasoningIn, state.server_cfg.max_request_bytes)
    check_parser(body.reasoning_parser)
    reasoning, text = ReasoningParser(body.reasoning_parser).split(body.text)
    out = {"reasoning_text": reasoning, "text": text}
    if body.return_blocks:
        blocks = ([{"type": "reasoning", "text": reasoning}] if reasoning else []) + [{"type": "text", "text": text}]
        out.update(reasoning_blocks=[reasoning] if reasoning else [], text_blocks=[text], blocks=blocks)
    return out


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state = request.app.state
    body = await parse(request, ChatIn, state.server_cfg.max_request_bytes)
    extra = body.model_extra or {}
    constrained = bool(grammar_source(extra) or response_format_source(extra.get("response_format")))
    # the tools' schemas are checked by xgrammar: off the event loop
    tools = await asyncio.to_thread(plan_tools, body, state.server_cfg.tool_call_parser, constrained, state.server_cfg)
    prompt, text = await _chat_prompt(state, body, tools)
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if limit is None:
        cap = state.server_cfg.max_new_tokens_cap
        limit = state.context_length - len(prompt) if cap is None else min(state.context_length - len(prompt), cap)
    params, spec = _params(state, body, limit)
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
        reason, matched = _finish(track)
        if delta is None:
            reasoning, text = parsers[i].split(text) if parsers else ("", text)
            text, tool_calls = parse_calls(callers[i], text) if callers else (text, [])
            reason, matched = finish(reason, matched, bool(tool_calls))
            logprobs = chat_logprobs(tok, track, k) if body.logprobs else None
            message = {
                "role": "assistant",
                "content": text or (None if tool_calls else ""),
                "reasoning_content": reasoning or None,
                "tool_calls": tool_calls or None,
            }
            return {
                "index": i,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": reason,
                "matched_stop": matched,
            }
        reasoning, text = split(i, delta(text, track.finished), track.finished)
        text, tool_calls = calls(i, text, track.finished)
        if not text and not reasoning and not tool_calls and reason is None:
            return None
        reason, matched = finish(reason, matched, called[i])
        logprobs = chat_logprobs(tok, track, k, start=reported[i]) if body.logprobs else None
        reported[i] = len(track.ids)
        out = {"reasoning_content": reasoning} if reasoning else {}
        out.update({"content": text} if text else {})
        out.update({"tool_calls": tool_calls} if tool_calls else {})
        return {"index": i, "delta": out, "logprobs": logprobs, "finish_reason": reason, "matched_stop": matched}

    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise ApiError(400, f"top_logprobs must be in [0, 20], got {body.top_logprobs}", param="top_logprobs")
    return await _serve(request, body, [prompt], params, spec, body.logprobs, "chat", render, {"top_logprobs_num": k})
