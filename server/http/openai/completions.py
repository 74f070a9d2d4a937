"""`/v1/completions`: prompts as text or token ids, `echo`, `logprobs=k`, streaming and not."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gleanrl.server.http.edge.body import parse
from gleanrl.server.http.edge.errors import bad_field, refuse_unsupported
from gleanrl.server.http.edge.limits import check_batch, check_top_logprobs, encode
from gleanrl.server.http.generate.detok import Delta, output_text
from gleanrl.server.http.generate.fanin import Track
from gleanrl.server.http.generate.params import check_prompt
from gleanrl.server.http.openai.serve import (
    TOOL_FIELDS,
    CompletionIn,
    completion_logprobs,
    finish_of,
    serve,
    to_sampling,
)

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request):
    state = request.app.state
    body = await parse(request, CompletionIn)
    refuse_unsupported(body.model_extra or {}, TOOL_FIELDS)  # the chat route's (SGLang)
    if body.logprobs is not None:
        check_top_logprobs(state, body.logprobs, "logprobs")
    raw = body.prompt
    if isinstance(raw, str) or (raw and isinstance(raw[0], int)):
        raw = [raw]
    if not raw:
        raise bad_field("prompt", "must not be empty")
    params, spec = to_sampling(state, body, 16 if body.max_tokens is None else body.max_tokens)  # OpenAI's default
    check_batch(state, len(raw) * params.n, "prompt")
    texts = iter(await encode(state, [p for p in raw if isinstance(p, str)]))
    prompts = [check_prompt(state, next(texts) if isinstance(p, str) else p, "prompt") for p in raw]
    tok = state.tokenizer
    k = body.logprobs or 0
    reported = [0] * (len(prompts) * params.n)  # output tokens whose logprobs a stream chunk carried
    echoed: set[int] = set()

    def render(i: int, track: Track, delta: Delta | None) -> dict | None:
        text = output_text(tok, track, body.skip_special_tokens, body.no_stop_trim)
        reason, matched = finish_of(track)
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
    return await serve(request, body, prompts, params, spec, body.logprobs is not None, "completion", render, options)
