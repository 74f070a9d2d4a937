"""The harvest feed (gleanrl extension, off by default): a bounded buffer of finished requests that a harvest sidecar
(`gleanrl harvest`) reads with a cursor, filled by `gleanrl serve --harvest-feed` or `gleanrl proxy`. Recording is an
O(1) append under a lock, never blocking generation; bounded in records and tokens, the oldest dropped and counted.
Records carry a monotonic `seq`; a reader asks for `seq >= cursor` and learns how many it `missed`; `feed_id` changes
with the buffer (a restarted server). Policy weight updates are listed in `weight_updates` (the sidecar refuses by name
those it cannot follow). `GET /harvest_feed?cursor=N&limit=M&wait_s=S` (admin key) long-polls up to `wait_s` and adds
the server's load (the sidecar trains only in its idle windows)."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import json
import threading
import time
import uuid
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import APIRouter, Request

from gleanrl.server.http.edge.errors import ApiError, bad_field

router = APIRouter()
MAX_WAIT_S = 30.0
POLL_S = 0.05

UPDATE_KINDS = {
    "/update_weights_from_disk": "disk",
    "/update_weights_from_tensor": "tensor",
    "/update_weights_from_distributed": "distributed",
}


def group_key(prompt_ids: list[int]) -> str:
    """The group (GRPO siblings, earlier steps' samples) of a prompt: blake2b-128 of its int64 token ids
    in hex, the group-drafts index's `prompt_key`."""
    return hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class FeedConfig:
    max_records: int = 4096
    max_tokens: int = 4_000_000  # prompt + output tokens held
    max_read: int = 512  # records per read
    max_read_tokens: int = 1_000_000  # tokens per read (at least one record)

    def __post_init__(self) -> None:
        for name in ("max_records", "max_tokens", "max_read", "max_read_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"harvest feed: {name} must be >= 1, got {getattr(self, name)}")


def _tokens(rec: dict) -> int:
    return len(rec["prompt_ids"] or ()) + len(rec["output_ids"])


class HarvestFeed:
    def __init__(self, cfg: FeedConfig | None = None):
        self.cfg = cfg or FeedConfig()
        self._records: collections.deque[dict] = collections.deque()
        self._lock = threading.Lock()
        self._tokens = self.next_seq = self.dropped = 0
        self._updates: collections.deque[dict] = collections.deque(maxlen=64)
        self.feed_id = uuid.uuid4().hex

    def record(
        self,
        rid: str,
        prompt_ids: list[int] | None,
        output_ids: list[int],
        weight_version,
        finish_reason: dict | None,
        prompt_text: str | None = None,
        meta: dict | None = None,
    ) -> None:
        """One finished request; `prompt_text` stands in for ids a proxy never saw."""
        rec = {
            "rid": rid,
            "prompt_ids": list(prompt_ids) if prompt_ids is not None else None,
            "prompt_text": prompt_text,
            "output_ids": list(output_ids),
            "group_key": group_key(prompt_ids) if prompt_ids is not None else None,
            "weight_version": None if weight_version is None else str(weight_version),
            "finish_reason": finish_reason,
            "finished_at": time.time(),
            **(meta or {}),
        }
        size = _tokens(rec)
        with self._lock:
            rec["seq"] = self.next_seq
            self.next_seq += 1
            self._records.append(rec)
            self._tokens += size
            while len(self._records) > self.cfg.max_records or (
                self._tokens > self.cfg.max_tokens and len(self._records) > 1
            ):
                self._tokens -= _tokens(self._records.popleft())
                self.dropped += 1

    def note_weight_update(self, kind: str, weight_version, model_path: str | None = None) -> None:
        version = None if weight_version is None else str(weight_version)
        with self._lock:
            self._updates.append(
                {"kind": kind, "weight_version": version, "model_path": model_path, "after_seq": self.next_seq}
            )

    def note_relayed_update(self, route: str, body: bytes, reply: bytes) -> None:
        """A weight-update call answered 200: listed if it changed the policy (`selector` not "draft")
        and the reply does not say `success: false`."""
        try:
            req, answer = json.loads(body or b"{}"), json.loads(reply or b"{}")
        except ValueError:
            return
        ok = not isinstance(answer, dict) or answer.get("success", True) is not False
        if ok and route in UPDATE_KINDS and isinstance(req, dict) and req.get("selector") != "draft":
            self.note_weight_update(UPDATE_KINDS[route], req.get("weight_version"), req.get("model_path"))

    def read(self, cursor: int, limit: int | None = None) -> dict:
        """Records with seq >= cursor (at most `limit`), the cursor to pass next, and counts."""
        if cursor < 0:
            raise ValueError(f"cursor must be >= 0, got {cursor}")
        limit = min(limit or self.cfg.max_read, self.cfg.max_read)
        with self._lock:
            oldest = self._records[0]["seq"] if self._records else self.next_seq
            start = max(cursor, oldest) - oldest
            out, size = [], 0
            for rec in itertools.islice(self._records, start, start + limit):
                size += _tokens(rec)
                if out and size > self.cfg.max_read_tokens:
                    break
                out.append(rec)
            next_cursor = out[-1]["seq"] + 1 if out else max(cursor, oldest)
            return {
                "feed_id": self.feed_id,
                "head": self.next_seq,
                "records": out,
                "next_cursor": next_cursor,
                "missed": max(oldest - cursor, 0),
                "dropped": self.dropped,
                "buffered": len(self._records),
                "tokens": self._tokens,
                "weight_updates": list(self._updates),
            }


class FeedUpdatesMiddleware:
    """Lists the app's successful policy weight updates in `feed` (pure ASGI: the request body and the
    reply are copied as they pass)."""

    def __init__(self, app, feed: HarvestFeed):
        self.app, self.feed = app, feed

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in UPDATE_KINDS:
            return await self.app(scope, receive, send)
        body, reply, status = bytearray(), bytearray(), [0]

        async def receive_copy():
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def send_copy(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                reply.extend(message.get("body", b""))
            await send(message)

        await self.app(scope, receive_copy, send_copy)
        if status[0] == 200:
            self.feed.note_relayed_update(scope["path"], bytes(body), bytes(reply))


@dataclass(slots=True)
class FeedState:
    """What the route reads of `app.state`: the server's (`app.AppState` extends it) or the proxy's."""

    feed: HarvestFeed | None  # GET /harvest_feed (None: off)
    feed_load: Callable[[], dict]  # running, queued, paused


def _int(request: Request, name: str, default: int | None, low: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, got {raw!r}", param=name) from None
    if value < low:
        raise ApiError(400, f"{name} must be >= {low}, got {value}", param=name)
    return value


@router.get("/harvest_feed")
async def harvest_feed(request: Request):
    state: FeedState = request.app.state
    if (feed := state.feed) is None:
        why = "start the server with `gleanrl serve --harvest-feed` (or put `gleanrl proxy` in front of it)"
        raise ApiError(404, f"the harvest feed is off: {why}", kind="not_found_error")
    unknown = sorted(set(request.query_params) - {"cursor", "limit", "wait_s"})
    if unknown:
        raise bad_field(unknown[0], "not a parameter of /harvest_feed (cursor, limit, wait_s)")
    cursor, limit = _int(request, "cursor", 0, 0), _int(request, "limit", None, 1)
    try:
        wait_s = min(max(float(request.query_params.get("wait_s", 0)), 0.0), MAX_WAIT_S)
    except ValueError:
        raise ApiError(400, "wait_s must be a number of seconds", param="wait_s") from None
    deadline = time.monotonic() + wait_s
    while feed.next_seq <= cursor and time.monotonic() < deadline:  # readers poll: writers never wait
        await asyncio.sleep(POLL_S)
    return {**feed.read(cursor, limit), "load": state.feed_load()}
