"""The engine requests of one HTTP request (a batch, n samples per prompt) run and their streams merged
into cumulative tracks, feeding the metrics; aborted when the HTTP side goes away."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gleanrl.server.http.edge.errors import ApiError, bad_field
from gleanrl.server.protocol import FEED_META, GenerateOutput, GenerateRequest, PromptLogprobs


@dataclass
class Track:
    """Cumulative state of one engine request."""

    req: GenerateRequest
    created: float = field(default_factory=time.perf_counter)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list = field(default_factory=list)  # per output token, when asked
    token_ids_logprobs: list = field(default_factory=list)  # per output token, when asked
    prompt_logprobs: PromptLogprobs | None = None  # tensors, when asked (with the first update)
    last: GenerateOutput | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    detok: Callable[[list[int], bool], str] | None = None  # the edge's detok.Detokenizer

    @functools.cached_property
    def input_logprobs(self) -> dict | None:
        """`PromptLogprobs.as_lists`: built where the answer is rendered, in a worker thread for a large one (~40k
        pairs for top_logprobs_num 64 over 600 tokens hold the GIL 10-25 ms: on the event loop they stalled every
        other client's stream)."""
        if self.prompt_logprobs is None:
            return None
        return self.prompt_logprobs.as_lists(self.req.input_ids, self.req.token_ids_logprob)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def finish_reason(self) -> dict | None:
        return self.last.finish_reason if self.last and self.finished else None


class Fanin:
    def __init__(
        self,
        engine,
        reqs: list[GenerateRequest],
        metrics,
        active: dict[str, list[str]],
        groups: dict[str, list[str]] | None = None,
        feed=None,
    ):
        """`active`: every running rid (and user rid of an n > 1 group) -> its engine rids (for
        /abort_request); `feed` (`harvest_feed.HarvestFeed` or None) records each finished one."""
        self.engine, self.metrics, self.active, self.feed = engine, metrics, active, feed
        self.tracks = [Track(r) for r in reqs]
        names = {r.rid: [r.rid] for r in reqs} | (groups or {})
        busy = [k for k in names if k in active]
        if busy or len(names) < len(reqs):
            raise bad_field("rid", f"a request with id {(busy or ['(duplicate)'])[0]!r} is already running")
        active.update(names)
        self.keys = list(names)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.tasks = [asyncio.create_task(self._pump(i, r)) for i, r in enumerate(reqs)]

    async def _pump(self, i: int, req: GenerateRequest) -> None:
        try:
            async for out in self.engine.generate(req):
                self.queue.put_nowait((i, out))
                if out.finished:
                    return
            self.queue.put_nowait((i, None))
        except Exception as exc:  # handed to the consumer, which decides 400 or 500
            self.queue.put_nowait((i, exc))

    async def events(self):
        """Yields the index of each track as it is updated, until all have finished."""
        pending = len(self.tracks)
        while pending:
            i, out = await self.queue.get()
            track = self.tracks[i]
            if isinstance(out, ValueError):
                raise ApiError(400, str(out))
            if isinstance(out, BaseException):
                raise out
            now = time.perf_counter()
            if out is None:  # the engine's stream ended without a final update
                reason = {"type": "abort", "message": "engine stream ended"}
                out = GenerateOutput(track.req.rid, [], [], finished=True, finish_reason=reason)
            track.ids += out.new_ids
            track.logprobs += out.new_logprobs
            track.top_logprobs += out.new_top_logprobs
            track.token_ids_logprobs += out.new_token_ids_logprobs
            if out.prompt_logprobs is not None:
                track.prompt_logprobs = out.prompt_logprobs
            track.last = out
            if out.new_ids:
                self.metrics.generation_tokens.inc(len(out.new_ids))
                if track.first_token_at is None:
                    track.first_token_at = now
                    self.metrics.ttft.observe(now - track.created)
            if out.finished:
                track.finished_at = now
                pending -= 1
                kind = (out.finish_reason or {}).get("type", "abort")
                self.metrics.finished(out.prompt_tokens or len(track.req.input_ids), kind, now - track.created)
                if self.feed is not None:
                    info, req = out.meta_info(), track.req
                    meta = {k: info[k] for k in FEED_META}
                    self.feed.record(
                        req.rid, req.input_ids, track.ids, out.weight_version, out.finish_reason, meta=meta
                    )
            yield i

    async def drain(self) -> list[Track]:
        async for _ in self.events():
            pass
        return self.tracks

    def close(self) -> None:
        """Idempotent: abort unfinished requests in the engine and forget the rids."""
        for track, task in zip(self.tracks, self.tasks):
            task.cancel()
            if not track.finished:
                self.engine.abort(track.req.rid)
        for key in self.keys:
            self.active.pop(key, None)
        self.keys = []


class Disconnected(Exception):
    pass


async def wait_disconnect(request) -> None:
    """Returns when the client has gone (call only after the body was read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(awaitable, request):
    """The result of `awaitable`, or `Disconnected` (and it cancelled) if the client goes first."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            raise Disconnected
        return work.result()
    finally:
        gone.cancel()
        work.cancel()


async def collect(run: Fanin, request) -> list[Track] | None:
    """The drained tracks, or None (the run aborted) if the client disconnects first."""
    try:
        return await unless_disconnected(run.drain(), request)
    except Disconnected:
        return None
    finally:
        run.close()
