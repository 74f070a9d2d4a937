"""SSE framing under odd text: a data line must stay one line for clients that split like
str.splitlines (httpx's aiter_lines: U+2028, U+2029, U+0085, ...). Found by `gleanrl bench crash`: a
tiny random model streamed U+2028 raw and the trainer's client died on half a JSON object."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gleanrl.clients.transport import sse_lines
from gleanrl.server.http.edge.errors import json_bytes, sse

ODD = "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg\x1dh\x1ei\rj\nk"


def test_sse_data_is_one_line_for_every_line_splitter():
    raw = sse({"text": ODD})
    assert [line for line in raw.decode().splitlines() if line] == [raw.decode().split("\n")[0]]
    assert json.loads(raw.decode().splitlines()[0][6:]) == {"text": ODD}


def test_client_splits_sse_at_newlines_only():
    event = json.dumps({"text": ODD}, ensure_ascii=False)
    assert "\u2028" in event  # raw, as a server that does not escape it (stock SGLang) sends
    body = f"data: {event}\r\n\r\ndata: [DONE]\n\n".encode()

    async def lines():
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
        async with httpx.AsyncClient(transport=transport) as client, client.stream("GET", "http://x/") as r:
            return [line async for line in sse_lines(r)]

    got = [line for line in asyncio.run(lines()) if line]
    assert len(got) == 2 and json.loads(got[0][6:]) == {"text": ODD} and got[1] == "data: [DONE]"


def test_answers_are_strict_json_as_sglangs():
    # json.dumps writes -Infinity (a masked token's logprob), which strict parsers refuse; SGLang's
    # orjson answers write null, and allow the integer keys of a token-id map
    raw = json_bytes({"logprob": float("-inf"), "nan": float("nan"), 7: "x", "text": ODD})
    assert json.loads(raw, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == {
        "logprob": None,
        "nan": None,
        "7": "x",
        "text": ODD,
    }
    assert b"\xe2\x80\xa8" not in raw
