"""Text at the edge: incremental detokenization as SGLang's (streamed and whole text agree; an update
decodes a few tokens, not the whole output), stop trimming, held-back stream deltas."""

from __future__ import annotations

from gleanrl.server.http.generate.fanin import Track

REPLACEMENT = "\ufffd"  # what a decode of an incomplete UTF-8 sequence ends with


class Detokenizer:
    """Decodes the window ids[surr:] against ids[surr:read] and appends the difference once it no
    longer ends in an incomplete character; the final call appends whatever is left."""

    def __init__(self, tokenizer, skip_special_tokens: bool):
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.text, self.surr, self.read = "", 0, 0

    def __call__(self, ids: list[int], final: bool) -> str:
        if len(ids) > self.read:
            before = self.tok.decode(ids[self.surr : self.read], skip_special_tokens=self.skip)
            now = self.tok.decode(ids[self.surr :], skip_special_tokens=self.skip)
            if final or not now.endswith(REPLACEMENT):
                self.text += now[len(before) :]
                self.surr, self.read = self.read, len(ids)
        return self.text


def output_text(tokenizer, track: Track, skip_special_tokens: bool = True, no_stop_trim: bool = False) -> str:
    """Decoded output as SGLang's: a matched stop token or string is cut from the text (not from
    `output_ids`) unless `no_stop_trim`."""
    if track.detok is None:
        track.detok = Detokenizer(tokenizer, skip_special_tokens)
    ids, matched = track.ids, (track.finish_reason or {}).get("matched")
    if isinstance(matched, int) and not no_stop_trim and ids and ids[-1] == matched:
        ids = ids[:-1]
    text = track.detok(ids, track.finished)
    if isinstance(matched, str) and matched and not no_stop_trim:
        pos = text.find(matched)
        text = text[:pos] if pos >= 0 else text
    return text


def tag_start(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a strict prefix of `tag` (a streaming parser holds it)."""
    for i in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-i:]):
            return i
    return 0


class Delta:
    """Incremental text for OpenAI streams: holds back len(longest stop) - 1 characters while running, so
    a stop string trimmed at the end is never half-sent."""

    def __init__(self, stop: list[str]):
        self.hold, self.sent = max((len(s) for s in stop), default=1) - 1, ""

    def __call__(self, text: str, finished: bool) -> str:
        if not finished and self.hold:
            text = text[: len(text) - self.hold]
        if not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta
