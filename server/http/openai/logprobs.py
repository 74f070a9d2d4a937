"""OpenAI-shaped logprobs from a track, as SGLang's: completions `logprobs=k` (with `echo` the prompt's
first) and chat `logprobs` / `top_logprobs=k`. `start` skips the output tokens a stream already sent."""

from __future__ import annotations

from functools import lru_cache

from gleanrl.server.http.generate.fanin import Track


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
