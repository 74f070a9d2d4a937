"""SGLang's logprob fields of `meta_info`: triples [logprob, token_id, text] (text only with `return_text_in_logprobs`),
per position a list of them (best first) for top_logprobs_num and token_ids_logprob."""

from __future__ import annotations

import asyncio

from gleanrl.server.http.generate.fanin import Track


def _triples(pairs, tok, text: bool) -> list[list]:
    pieces = [tok.decode([t]) for _, t in pairs] if text else [None] * len(pairs)
    return [[lp, t, x] for (lp, t), x in zip(pairs, pieces)]


def _rows(rows, tok, text: bool) -> list:
    return [_triples(r, tok, text) if r else None for r in rows]


def logprob_fields(track: Track, tok, text: bool) -> dict:
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


async def fill_input_logprobs(engine, tracks: list[Track]) -> None:
    """The prompt logprobs of every track that asks, once per distinct (prompt, options)."""
    done: dict[tuple, dict] = {}
    for t in tracks:
        req = t.req
        if not req.return_logprob or req.logprob_start_len < 0:
            continue
        key = (tuple(req.input_ids), req.logprob_start_len, req.top_logprobs_num, tuple(req.token_ids_logprob or ()))
        if key not in done:
            args = (req.input_ids, req.logprob_start_len, req.top_logprobs_num, req.token_ids_logprob)
            done[key] = await asyncio.to_thread(engine.prompt_logprobs, *args)
        t.input_logprobs = done[key]
