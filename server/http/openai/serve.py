"""What /v1/completions and /v1/chat/completions share: sampling params from OpenAI's fields (errors
named as OpenAI names them), the run on the generation core of `generate/`, and the answer as one
JSON object (usage; finish_reason plus SGLang's `matched_stop`) or as an SSE stream of chunks."""

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


def to_sampling(state, body: OpenAISampling, max_tokens: int | None):
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

        def shape(tracks: list[Track]) -> dict:
            return {
                **head,
                "object": "chat.completion" if kind == "chat" else "text_completion",
                "choices": [render(i, t, None) for i, t in enumerate(tracks)],
                "usage": _usage(tracks, params.n),
            }

        return await whole(run, request, shape)
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
