"""The generation routes' answers: SGLang's `/generate` shape (gleanrl adds `draft_weight_version` and
`spec_accept_length`) with its logprob fields, the answer's size in bytes, and the SSE stream every
generation route sends."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from gleanrl.server.http.edge.body import off_loop
from gleanrl.server.http.edge.errors import SSE_DONE, ApiError, json_response, sse
from gleanrl.server.http.generate.detok import output_text
from gleanrl.server.http.generate.fanin import Disconnected, Fanin, Track, collect, unless_disconnected, wait_disconnect


def _triples(pairs, tok, text: bool) -> list[list]:
    """[logprob, token_id, text] (text only with `return_text_in_logprobs`)."""
    pieces = [tok.decode([t]) for _, t in pairs] if text else [None] * len(pairs)
    return [[lp, t, x] for (lp, t), x in zip(pairs, pieces)]


def _rows(rows, tok, text: bool) -> list:
    return [_triples(r, tok, text) if r else None for r in rows]


def logprob_fields(track: Track, tok, text: bool) -> dict:
    """SGLang's logprob fields of `meta_info`; per position a list of triples (best first) for
    top_logprobs_num and token_ids_logprob."""
    req = track.req
    inp = track.input_logprobs or {"token": [], "top": [], "ids": []}
    tops, picked = track.top_logprobs, track.token_ids_logprobs
    if req.params.max_new_tokens == 0 and "next_top" in inp:  # SGLang scores the position after the prompt
        tops, picked = [inp["next_top"]], [inp["next_ids"]]
    out = {
        "input_token_logprobs": _triples(inp["token"], tok, text),
        "output_token_logprobs": _triples(list(zip(track.logprobs, track.ids)), tok, text),
        "output_token_logprobs_length": len(track.ids),
    }
    if req.top_logprobs_num > 0:
        out["input_top_logprobs"] = _rows(inp["top"], tok, text)
        out["output_top_logprobs"] = _rows(tops, tok, text)
    if req.token_ids_logprob is not None:
        out["input_token_ids_logprobs"] = _rows(inp["ids"], tok, text)
        out["output_token_ids_logprobs"] = _rows(picked, tok, text)
    return out


def meta_info(track: Track, tok=None, text_in_logprobs: bool = False) -> dict:
    last, req = track.last, track.req
    info = {
        "id": req.rid,
        "finish_reason": track.finish_reason,
        "prompt_tokens": (last.prompt_tokens if last else 0) or len(req.input_ids),
        "completion_tokens": len(track.ids),
        "cached_tokens": 0,
        **(last.meta_info() if last else {"weight_version": None, "draft_weight_version": None}),
    }
    if req.return_logprob:
        info.update(logprob_fields(track, tok, text_in_logprobs))
    if track.finished:
        info["e2e_latency"] = track.finished_at - track.created
    return info


def answer_bytes(tracks: list[Track], planned: bool = False) -> int:
    """About how many bytes of JSON the logprob fields of `tracks` make (~30 a triple), with the tokens
    so far or, `planned`, max_new_tokens: what decides rendering off the event loop."""
    triples = 0
    for t in tracks:
        req = t.req
        if req.return_logprob:
            out = req.params.max_new_tokens if planned else len(t.ids)
            scored = out + (len(req.input_ids) if req.logprob_start_len >= 0 else 0)
            triples += scored * (1 + req.top_logprobs_num + len(req.token_ids_logprob or ()))
    return 30 * triples


def render(state, track: Track, sp, text_in_logprobs: bool = False) -> dict:
    """One /generate answer; `sp`: its `SamplingIn`."""
    tok = state.tokenizer
    text = output_text(tok, track, sp.skip_special_tokens, sp.no_stop_trim)
    return {"text": text, "output_ids": list(track.ids), "meta_info": meta_info(track, tok, text_in_logprobs)}


async def whole(run: Fanin, request: Request, shape) -> Response | None:
    """`shape(tracks)` as JSON once every track has finished; None when the client went first (the run
    is aborted). A large answer (megabytes with logprobs) is built in a worker thread."""
    tracks = await collect(run, request)
    if tracks is None:
        return None
    return await off_loop(lambda: json_response(shape(tracks)), answer_bytes(tracks))


async def stream(run: Fanin, request: Request, chunks, tail=lambda: []) -> Response:
    """SSE: `chunks(i)` gives the objects to send after track i was updated, `tail()` those before
    [DONE]; 400 if the engine refuses before the first update. A client that goes away (even while no
    chunk is due, e.g. paused) ends the body, whose `finally` aborts the engine requests."""
    events = run.events()
    try:  # waiting for the first update (queued, paused) also ends when the client goes
        first = await unless_disconnected(anext(events), request)
    except Disconnected:
        run.close()
        return Response(status_code=499)
    except BaseException:
        run.close()
        raise

    # large chunks render in a worker thread; safe: the tracks change only in `events`, which waits
    size = answer_bytes(run.tracks, planned=True)

    async def body():
        gone = asyncio.ensure_future(wait_disconnect(request))
        try:
            i = first
            while True:
                for data in await off_loop(lambda j: [sse(obj) for obj in chunks(j)], size, i):
                    yield data
                nxt = asyncio.ensure_future(anext(events))
                await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    nxt.cancel()
                    return
                i = nxt.result()
        except StopAsyncIteration:
            for obj in tail():
                yield sse(obj)
            yield SSE_DONE
        except ApiError as exc:
            yield sse(exc.body())
            yield SSE_DONE
        finally:
            gone.cancel()
            run.close()

    return StreamingResponse(body(), media_type="text/event-stream")
