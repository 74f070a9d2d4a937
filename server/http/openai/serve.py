"""What /v1/completions and /v1/chat/completions share: their request bodies (OpenAI's fields plus SGLang's extras;
types checked here, value ranges by `server.protocol.SamplingParams`), sampling params from them (errors naming
OpenAI's fields), the run, OpenAI-shaped logprobs, and the answer as one JSON object (usage; finish_reason and
SGLang's `matched_stop`) or an SSE stream of chunks."""

from __future__ import annotations

import time
import uuid
from functools import lru_cache
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from gleanrl.server.http.edge.errors import ApiError, bad_field, refuse_unsupported
from gleanrl.server.http.edge.limits import check_serving
from gleanrl.server.http.generate.answer import stream, whole
from gleanrl.server.http.generate.detok import Delta
from gleanrl.server.http.generate.fanin import Track
from gleanrl.server.http.generate.grammar import grammar_source, response_format_source
from gleanrl.server.http.generate.params import check_length, expand, sampling, start_run, with_grammar
from gleanrl.server.http.generate.route import Number, Stop

# SGLang fields the embedded engine does not implement (`edge.errors.refuse_unsupported`)
UNSUPPORTED_OPENAI = tuple(
    """functions function_call structural_tag lora_path return_hidden_states custom_logit_processor audio
    prediction""".split()
)
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # the chat route's only


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class OpenAISampling(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's, plus SGLang's extras)."""

    model_config = ConfigDict(extra="allow")  # extras: checked against UNSUPPORTED_OPENAI, others ignored
    model: StrictStr | None = None  # any name: the served model, echoed (SGLang)
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: StrictInt | None = None
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    user: StrictStr | None = None
    top_k: StrictInt = -1
    min_p: Number = 0.0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    rid: StrictStr | None = None
    repetition_penalty: Number = 1.0  # SGLang's extra sampling fields
    min_tokens: StrictInt = 0
    logit_bias: dict[StrictStr, Number] | None = None
    stop_regex: Stop = None
    custom_params: dict[StrictStr, Any] | None = None


class CompletionIn(OpenAISampling):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    echo: StrictBool = False
    logprobs: StrictInt | None = None  # up to --max-top-logprobs-num (SGLang: no limit)


class ChatMessage(BaseModel):
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls (history)
    tool_call_id: StrictStr | None = None  # a tool message's answer to one
    name: StrictStr | None = None


class ChatIn(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    separate_reasoning: StrictBool = True  # with --reasoning-parser (SGLang's fields)
    stream_reasoning: StrictBool = True
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None


# OpenAI's sampling fields that SGLang names alike
SAME_NAMES = ("n", "stop", "top_k", "min_p", "ignore_eos", "stop_token_ids", "seed", "logit_bias", "stop_regex")
PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")


def to_sampling(state, body: OpenAISampling, max_tokens: int | None):
    sp = {k: getattr(body, k) for k in SAME_NAMES + PENALTIES}
    sp |= {k: 1.0 if getattr(body, k) is None else getattr(body, k) for k in ("temperature", "top_p")}
    sp |= {"max_new_tokens": max_tokens, "min_new_tokens": body.min_tokens}
    extra = body.model_extra or {}
    refuse_unsupported(extra, UNSUPPORTED_OPENAI)
    spec = grammar_source(extra)
    fmt = response_format_source(extra.get("response_format"))
    if spec and fmt:
        raise bad_field(spec[2], "response_format already constrains the output")
    try:
        return sampling(state, sp, field=""), spec or fmt
    except ApiError as exc:  # name OpenAI's fields, not SGLang's
        for name in ("message", "param"):
            text = (getattr(exc, name) or "").lstrip(".").replace("max_new_tokens", "max_tokens")
            setattr(exc, name, text.replace("min_new_tokens", "min_tokens"))
        raise


def finish_of(track: Track) -> tuple[str | None, int | str | None]:
    reason = track.finish_reason
    return (reason["type"], reason.get("matched")) if reason else (None, None)


def _usage(tracks: list[Track], n: int) -> dict:
    prompt = sum(len(t.req.input_ids) for t in tracks[::n])
    completion = sum(len(t.ids) for t in tracks)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def serve(
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
    """Run, then answer as one JSON object or an SSE stream. `options`: GenerateRequest's logprob fields."""
    state = request.app.state
    check_serving(state)
    params = await with_grammar(state, params, spec)
    if not isinstance(body, ChatIn) or body.max_tokens is not None or body.max_completion_tokens is not None:
        for ids in prompts:  # an explicit limit that does not fit: SGLang's 400
            check_length(state, ids, params, "prompt" if kind != "chat" else "messages")
    rids = [body.rid] if len(prompts) == 1 else [None] * len(prompts)  # SGLang's rid extension: one prompt only
    reqs, groups = expand(
        prompts, [params] * len(prompts), rids, [logprob] * len(prompts), [options or {}] * len(prompts)
    )
    run = start_run(state, reqs, groups)
    head = {
        "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": body.model or state.served_model_name,
    }
    if not body.stream:

        def shape(tracks: list[Track]) -> dict:
            obj = "chat.completion" if kind == "chat" else "text_completion"
            choices = [render(i, t, None) for i, t in enumerate(tracks)]
            return {**head, "object": obj, "choices": choices, "usage": _usage(tracks, params.n)}

        return await whole(run, request, shape)
    deltas = [Delta(params.stop) for _ in reqs]
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    started: set[int] = set()

    def chunks(i: int) -> list[dict]:
        track, out = run.tracks[i], []
        if kind == "chat" and i not in started:
            started.add(i)
            role = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            out.append({**head, "object": obj, "choices": [role]})
        choice = render(i, track, deltas[i])
        if choice is not None:
            out.append({**head, "object": obj, "choices": [choice]})
        return out

    def tail() -> list[dict]:
        if not (body.stream_options and body.stream_options.include_usage):
            return []
        return [{**head, "object": obj, "choices": [], "usage": _usage(run.tracks, params.n)}]

    return await stream(run, request, chunks, tail)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def token_text(tok, token_id: int) -> str:
    """The token's text; a byte-level fragment (invalid UTF-8 on its own) as latin-1 of its raw
    bytes, so distinct fragments stay distinct keys (SGLang's `_lossless_token_text`)."""
    text = tok.decode([token_id])
    if "\ufffd" not in text:
        return text
    piece = tok.convert_ids_to_tokens(token_id)
    try:
        raw = bytes(_byte_decoder()[c] for c in piece)
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")
    except (KeyError, TypeError):  # not a byte-level tokenizer
        pass
    return text


def completion_logprobs(tok, track: Track, k: int, echo: bool = False, start: int = 0) -> dict:
    pairs = list(zip(track.logprobs, track.ids))[start:]
    tops = track.top_logprobs[start:] if k > 0 else []
    if echo and track.input_logprobs is not None:
        pairs = track.input_logprobs["token"] + pairs
        tops = (track.input_logprobs["top"] if k > 0 else []) + tops
    pieces = [token_text(tok, t) for _, t in pairs]
    offsets = [sum(len(p) for p in pieces[:j]) for j in range(len(pieces))]
    top = [None if row is None else {token_text(tok, t): lp for lp, t in row} for row in tops] if k > 0 else None
    return {"tokens": pieces, "token_logprobs": [lp for lp, _ in pairs], "text_offset": offsets, "top_logprobs": top}


def _entry(tok, token_id: int, logprob: float) -> dict:
    s = tok.decode([token_id])
    return {"token": s, "logprob": logprob, "bytes": list(s.encode())}


def chat_logprobs(tok, track: Track, k: int, start: int = 0) -> dict:
    tops = track.top_logprobs[start:] if k > 0 else [[] for _ in track.ids[start:]]
    return {
        "content": [
            {**_entry(tok, t, lp), "top_logprobs": [_entry(tok, tt, tlp) for tlp, tt in (row or [])]}
            for t, lp, row in zip(track.ids[start:], track.logprobs[start:], tops)
        ]
    }
