"""`GET /harvest_feed?cursor=N&limit=M&wait_s=S` (admin key): finished requests from the harvest feed,
long-polling up to `wait_s` for one past the cursor, and the server's load (the sidecar trains only in
its idle windows). With the feed off: 404 saying how to turn it on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import APIRouter, Request

from gleanrl.server.http.edge.errors import ApiError, bad_field
from gleanrl.server.http.native.harvest_feed import HarvestFeed

router = APIRouter()
MAX_WAIT_S = 30.0
POLL_S = 0.05


@dataclass(slots=True)
class FeedState:
    """What the route reads of `app.state`: the server's (`state.AppState` extends it) or the proxy's."""

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
