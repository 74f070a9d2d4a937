"""SGLang's text routes: /tokenize and /detokenize (also under /v1/; the server's tokenizer and chat template,
SGLang 0.5.23's shapes, `serving_tokenize.py`) and /separate_reasoning (a text split by the reasoning parser
the body names, `generate/reasoning.py`)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, StrictBool, StrictInt, StrictStr

from gleanrl.server.http.edge.body import parse
from gleanrl.server.http.edge.errors import ApiError
from gleanrl.server.http.edge.limits import check_vocab, encode
from gleanrl.server.http.generate.reasoning import ReasoningParser, check_parser
from gleanrl.server.http.openai.chat import chat_text
from gleanrl.server.http.openai.serve import ChatMessage

router = APIRouter()


class TokenizeIn(BaseModel):
    """SGLang's TokenizeRequest: exactly one of `prompt` and `messages`."""

    model: StrictStr | None = None
    prompt: StrictStr | list[StrictStr] | None = None
    messages: list[ChatMessage] | None = None
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool | None = None


class DetokenizeIn(BaseModel):
    """SGLang's DetokenizeRequest."""

    model: StrictStr | None = None
    tokens: list[StrictInt] | list[list[StrictInt]]
    skip_special_tokens: StrictBool = True


class SeparateReasoningIn(BaseModel):
    """SGLang's SeparateReasoningReqInput."""

    text: StrictStr
    reasoning_parser: StrictStr
    return_blocks: StrictBool = False


def _max_model_len(state) -> int:
    """The tokenizer's model_max_length when a 64-bit integer (as SGLang), else the context length."""
    n = getattr(state.tokenizer, "model_max_length", -1)
    return n if isinstance(n, int) and -(2**63) <= n < 2**64 else state.context_length


@router.post("/tokenize")
@router.post("/v1/tokenize")
async def tokenize(request: Request):
    state = request.app.state
    body = await parse(request, TokenizeIn)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "Exactly one of 'prompt' or 'messages' must be provided.", param="prompt")
    special = body.add_special_tokens
    if body.messages is not None:
        opened = body.add_generation_prompt is not False
        prompt = await chat_text(state, body.messages, body.chat_template_kwargs, add_generation_prompt=opened)
        # as SGLang: a template's text is encoded without special tokens unless both asked
        special = special and body.add_generation_prompt is not None and "add_special_tokens" in body.model_fields_set
    else:
        prompt = body.prompt
    tokens = await encode(state, [prompt] if isinstance(prompt, str) else prompt, add_special_tokens=special)
    tokens, count = (tokens[0], len(tokens[0])) if isinstance(prompt, str) else (tokens, [len(t) for t in tokens])
    return {"tokens": tokens, "count": count, "max_model_len": _max_model_len(state)}


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(request: Request):
    state = request.app.state
    body = await parse(request, DetokenizeIn)
    nested = bool(body.tokens) and isinstance(body.tokens[0], list)
    lists = body.tokens if nested else [body.tokens]
    for i, ids in enumerate(lists):
        check_vocab(state, ids, f"tokens.{i}" if nested else "tokens")
    tok = state.tokenizer
    texts = await asyncio.to_thread(
        lambda: [tok.decode(ids, skip_special_tokens=body.skip_special_tokens) for ids in lists]
    )
    return {"text": texts if nested else texts[0]}


@router.post("/separate_reasoning")
async def separate_reasoning(request: Request):
    body = await parse(request, SeparateReasoningIn)
    check_parser(body.reasoning_parser)
    reasoning, text = ReasoningParser(body.reasoning_parser).split(body.text)
    out = {"reasoning_text": reasoning, "text": text}
    if body.return_blocks:
        blocks = ([{"type": "reasoning", "text": reasoning}] if reasoning else []) + [{"type": "text", "text": text}]
        out.update(reasoning_blocks=[reasoning] if reasoning else [], text_blocks=[text], blocks=blocks)
    return out
