"""SGLang's /tokenize and /detokenize (also under /v1/): the server's tokenizer and chat template,
SGLang 0.5.23's request and response shapes (`serving_tokenize.py`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from gleanrl.server.http.limits import encode
from gleanrl.server.http.openai import chat_text
from gleanrl.server.http.schemas import ApiError, DetokenizeIn, TokenizeIn, parse

router = APIRouter()


def _max_model_len(state) -> int:
    """The tokenizer's model_max_length when it is a 64-bit integer (as SGLang), else the
    context length."""
    n = getattr(state.tokenizer, "model_max_length", -1)
    return n if isinstance(n, int) and -(2**63) <= n < 2**64 else state.context_length


@router.post("/tokenize")
@router.post("/v1/tokenize")
async def tokenize(request: Request):
    state = request.app.state
    body = await parse(request, TokenizeIn, state.server_cfg.max_request_bytes)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "Exactly one of 'prompt' or 'messages' must be provided.", param="prompt")
    if body.messages is not None:
        text = await chat_text(
            state,
            body.messages,
            body.chat_template_kwargs,
            add_generation_prompt=body.add_generation_prompt is not False,
        )
        # as SGLang: a template's text is encoded without special tokens unless both asked
        special = (
            body.add_generation_prompt is not None
            and body.add_special_tokens
            and "add_special_tokens" in body.model_fields_set
        )
        (tokens,) = await encode(state, [text], add_special_tokens=special)
        count = len(tokens)
    elif isinstance(body.prompt, str):
        (tokens,) = await encode(state, [body.prompt], add_special_tokens=body.add_special_tokens)
        count = len(tokens)
    else:
        tokens = await encode(state, body.prompt, add_special_tokens=body.add_special_tokens)
        count = [len(t) for t in tokens]
    return {"tokens": tokens, "count": count, "max_model_len": _max_model_len(state)}


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(request: Request):
    state = request.app.state
    body = await parse(request, DetokenizeIn, state.server_cfg.max_request_bytes)
    nested = bool(body.tokens) and isinstance(body.tokens[0], list)
    lists = body.tokens if nested else [body.tokens]
    for i, ids in enumerate(lists):
        bad = next((t for t in ids if not 0 <= t < state.vocab_size), None)
        if bad is not None:
            field = f"tokens.{i}" if nested else "tokens"
            raise ApiError(
                400, f"{field}: token id {bad} is outside the vocabulary [0, {state.vocab_size})", param=field
            )
    tok = state.tokenizer
    texts = await asyncio.to_thread(
        lambda: [tok.decode(ids, skip_special_tokens=body.skip_special_tokens) for ids in lists]
    )
    return {"text": texts if nested else texts[0]}
