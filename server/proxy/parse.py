"""What the proxy records from one relayed `/generate`: its prompts, one per output (prompt-major, as
SGLang orders a batch), and the outputs read from the relayed bytes (one JSON body, or SSE chunks;
`output_ids` cumulative or incremental). What it cannot read is relayed all the same, not recorded."""

from __future__ import annotations

import json

from gleanrl.server.http.native.harvest_feed import HarvestFeed
from gleanrl.server.protocol import FEED_META

GENERATE_PATHS = frozenset({"/generate"})
MAX_BODY_BYTES = 256 * 1024 * 1024  # a larger non-streamed reply is relayed but not recorded
MAX_OUTPUTS = 1024  # prompts x n of one /generate (the server's --max-batch default)


def _prompts(req: dict) -> list[tuple[list[int] | None, str | None]] | None:
    ids, text = req.get("input_ids"), req.get("text")
    if ids is not None:
        batch = bool(ids) and isinstance(ids[0], list)
        return [(list(p), None) for p in (ids if batch else [ids])]
    if text is not None:
        return [(None, t) for t in (text if isinstance(text, list) else [text])]
    return None


class TooMany(Exception):
    """A /generate body asks for more outputs than the proxy relays (its 400)."""


def per_output(req: dict, max_outputs: int = MAX_OUTPUTS) -> list[tuple[list[int] | None, str | None]] | None:
    prompts = _prompts(req)
    if prompts is None:
        return None
    sp = req.get("sampling_params") or {}
    each = [(s or {}).get("n", 1) for s in sp] if isinstance(sp, list) else [sp.get("n", 1)] * len(prompts)
    ns = [int(n or 1) for n in each]
    total = sum(ns[: len(prompts)])
    if total > max_outputs:  # counted before the list is built
        raise TooMany(
            f"sampling_params.n: {total} outputs (prompts x n) in one request; the proxy's limit is {max_outputs}"
        )
    return [p for p, n in zip(prompts, ns) for _ in range(n)]


class Recorder:
    def __init__(self, prompts: list, stream: bool, feed: HarvestFeed):
        self.prompts, self.stream, self.feed = prompts, stream, feed
        self._buf = bytearray()
        self._ids: dict[int, list[int]] = {}
        self._meta: dict[int, dict] = {}
        self._broken = False

    @classmethod
    def for_request(
        cls, route: str, method: str, body: bytes, feed: HarvestFeed | None, max_outputs: int = MAX_OUTPUTS
    ) -> Recorder | None:
        """A recorder for a /generate (None for other routes); TooMany over `max_outputs`."""
        if route not in GENERATE_PATHS or method not in ("POST", "PUT"):
            return None
        try:
            req = json.loads(body)
            prompts = per_output(req, max_outputs) if isinstance(req, dict) else None
        except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
            req, prompts = {}, None
        return cls(prompts or [], bool(prompts) and bool(req.get("stream")), feed)

    def feed_bytes(self, chunk: bytes) -> None:
        if self._broken or not self.prompts or self.feed is None:
            return
        self._buf += chunk
        if not self.stream:
            self._broken = len(self._buf) > MAX_BODY_BYTES
            return
        *lines, rest = bytes(self._buf).split(b"\n")
        self._buf = bytearray(rest)
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                try:
                    self._chunk(json.loads(line[5:]))
                except (ValueError, TypeError, KeyError, AttributeError):
                    continue  # an error object or a line it cannot read: relayed, not recorded

    def _chunk(self, obj: dict) -> None:
        i, new, meta = int(obj.get("index", 0)), list(obj.get("output_ids") or []), obj["meta_info"]
        old = self._ids.get(i, [])
        cumulative = len(new) == meta.get("completion_tokens", len(new)) and len(new) >= len(old)
        self._ids[i] = new if cumulative else old + new
        self._meta[i] = meta

    def finish(self) -> None:
        if self._broken or not self.prompts or self.feed is None:
            return
        if not self.stream:
            try:
                reply = json.loads(bytes(self._buf))
            except ValueError:
                return
            for i, out in enumerate(reply if isinstance(reply, list) else [reply]):
                if isinstance(out, dict) and "meta_info" in out:
                    self._ids[i], self._meta[i] = list(out.get("output_ids") or []), out["meta_info"]
        for i, meta in sorted(self._meta.items()):
            if i < len(self.prompts) and meta.get("finish_reason") is not None:
                ids, text = self.prompts[i]
                extra = {k: meta.get(k) for k in FEED_META}
                version, reason = meta.get("weight_version"), meta["finish_reason"]
                self.feed.record(str(meta.get("id")), ids, self._ids[i], version, reason, prompt_text=text, meta=extra)
