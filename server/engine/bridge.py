"""Thread-to-asyncio delivery of engine outputs.

The decode thread appends outputs for any number of event loops; `flush` hands them over with one `call_soon_threadsafe`
per loop. Each hand-over wakes the loop's thread, a GIL hand-off that costs about as much as a small model's decode
step, so the engine flushes once per interval, not per token."""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from gleanrl.server.protocol import GenerateOutput


def _deliver(items: list[tuple[asyncio.Queue, GenerateOutput]]) -> None:
    for queue, out in items:
        queue.put_nowait(out)


class Outbox:
    def __init__(self) -> None:
        self._items: deque = deque()  # (loop, queue, output); append/popleft are thread-safe
        self._lock = threading.Lock()  # one flusher at a time keeps each request's outputs in order

    def put(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, out: GenerateOutput) -> None:
        self._items.append((loop, queue, out))

    def flush(self) -> None:
        with self._lock:
            by_loop: dict = {}
            while self._items:
                loop, queue, out = self._items.popleft()
                by_loop.setdefault(loop, []).append((queue, out))
            for loop, items in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_deliver, items)
                except RuntimeError:  # the consumer's loop is closed: nobody listens any more
                    pass
