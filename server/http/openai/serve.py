"""What /v1/completions and /v1/chat/completions share: sampling params from OpenAI's fields (errors naming them), the
run, and the answer as one JSON object (usage; finish_reason and SGLang's `matched_stop`) or an SSE stream of chunks."""

from __future__ import annotations

import time
import uuid

from fastapi import Request

from gleanrl.server.http.edge.errors import ApiError, bad_field, refuse_unsupported
from gleanrl.server.http.edge.limits import check_serving
from gleanrl.server.http.generate.answer import stream, whole
from gleanrl.server.http.generate.detok import Delta
from gleanrl.server.http.generate.fanin import Track
from gleanrl.server.http.generate.grammar import grammar_source, response_format_source
from gleanrl.server.http.generate.params import check_length, expand, sampling, start_run, with_grammar
from gleanrl.server.http.openai.bodies import UNSUPPORTED_OPENAI, ChatIn, OpenAISampling

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
    run = await start_run(state, reqs, groups)
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
