"""SGLang's `/separate_reasoning`: a text split into reasoning and answer by the reasoning parser the
body names (`generate/reasoning.py`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, StrictBool, StrictStr

from gleanrl.server.http.edge.body import parse
from gleanrl.server.http.generate.reasoning import ReasoningParser, check_parser

router = APIRouter()


class SeparateReasoningIn(BaseModel):
    """SGLang's SeparateReasoningReqInput."""

    text: StrictStr
    reasoning_parser: StrictStr
    return_blocks: StrictBool = False


@router.post("/separate_reasoning")
async def separate_reasoning(request: Request):
    """SGLang's native route: `text` split by the parser the body names."""
    body = await parse(request, SeparateReasoningIn)
    check_parser(body.reasoning_parser)
    reasoning, text = ReasoningParser(body.reasoning_parser).split(body.text)
    out = {"reasoning_text": reasoning, "text": text}
    if body.return_blocks:
        blocks = ([{"type": "reasoning", "text": reasoning}] if reasoning else []) + [{"type": "text", "text": text}]
        out.update(reasoning_blocks=[reasoning] if reasoning else [], text_blocks=[text], blocks=blocks)
    return out
