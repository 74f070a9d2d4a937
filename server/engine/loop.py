"""The engine's decode thread: apply a due weight swap, admit waiting requests, run one iteration, retire the finished
and aborted ones, deliver outputs. Everything but the forward runs under the state's lock; the forward runs with
`state.in_step` set, so callers that change the running set wait for it.

Hazard: libgomp (torch's OpenMP) all but stops its workers' spinning once the process has more OpenMP threads than
CPUs, e.g. a second thread team after the model was loaded on another thread, or a weight update loaded on an HTTP
worker thread; every small kernel of a decode step then waits for a futex wake-up (on 2 cores the server's forward took
1.7x its time alone, and 270 tok/s fell to 131-186 after a weight update). So this thread alone runs with the engine's
intra-op threads: it pins its own count when it starts (torch reads the process-wide count into a thread's OpenMP
settings on its first use), then every other thread of the process runs torch single-threaded (no second team).

Outputs reach asyncio through the `Outbox`: the decode thread appends them for any number of event loops; `flush` hands
them over with one `call_soon_threadsafe` per loop. Each hand-over wakes the loop's thread, a GIL hand-off that costs
about as much as a small model's decode step, so the loop flushes once per FLUSH_INTERVAL_S, not per token."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from gleanrl.server.decode.sd_decoder import SDDecoder
from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import EngineState
from gleanrl.server.engine.swap import WeightSwapper
from gleanrl.server.protocol import GenerateOutput
from gleanrl.server.sampling.sequence import Sequence

log = logging.getLogger(__name__)
FLUSH_INTERVAL_S = 0.02  # streamed updates reach the event loop at most this late (first/last: at once)


def _deliver(items: list[tuple[asyncio.Queue, GenerateOutput]]) -> None:
    for queue, out in items:
        queue.put_nowait(out)


class Outbox:
    """Thread-to-asyncio delivery of engine outputs (module docstring)."""

    def __init__(self) -> None:
        self._items: deque = deque()  # ((loop, queue), output); append/popleft are thread-safe
        self._lock = threading.Lock()  # one flusher at a time keeps each request's outputs in order

    def put(self, key: tuple[asyncio.AbstractEventLoop, asyncio.Queue], out: GenerateOutput) -> None:
        """`key`: where `out` goes (the consumer's loop and queue; `Engine.submit`)."""
        self._items.append((key, out))

    def flush(self) -> None:
        with self._lock:
            by_loop: dict = {}
            while self._items:
                (loop, queue), out = self._items.popleft()
                by_loop.setdefault(loop, []).append((queue, out))
            for loop, items in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_deliver, items)
                except RuntimeError:  # the consumer's loop is closed: nobody listens any more
                    pass


class DecodeLoop:
    def __init__(
        self,
        state: EngineState,
        scheduler: Scheduler,
        decoder: SDDecoder,
        swapper: WeightSwapper,
        flush: Callable[[], None],
        threads: int = 1,
    ):
        self.state, self.scheduler, self.decoder, self.swapper, self.flush = state, scheduler, decoder, swapper, flush
        self.threads = threads
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is None:
            pinned = threading.Event()
            self.thread = threading.Thread(target=self._run, args=(pinned,), name="gleanrl-engine", daemon=True)
            self.thread.start()
            pinned.wait()
            self.caller_threads = torch.get_num_threads()
            torch.set_num_threads(1)  # every later thread starts single-threaded; this one keeps its count

    def stop(self) -> None:
        with self.state.cv:
            self.state.stopping = True
            self.state.cv.notify_all()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
            torch.set_num_threads(self.caller_threads)  # the process's count as it was before `start`

    def _run(self, pinned: threading.Event) -> None:
        torch.set_num_threads(self.threads)
        torch.get_num_threads()  # torch's first use in this thread fixes its OpenMP thread count
        pinned.set()
        st, last_flush = self.state, 0.0
        while True:
            with st.cv:
                while not (st.stopping or self.swapper.ready() or (st.paused is None and (st.running or st.waiting))):
                    self.flush()
                    st.cv.wait()
                if st.stopping:
                    return
                if self.swapper.ready():
                    self.swapper.apply()
                    st.cv.notify_all()
                    continue
                self.scheduler.admit()
                st.in_step = True
            finished: list[Sequence] = []
            try:
                finished = self.scheduler.step(self.decoder)
            except Exception:  # a bad request or a bug must not fail every client: find the request
                log.exception("engine step failed; stepping its requests one at a time")
                finished = self._isolate()
            finally:
                with st.cv:
                    st.in_step = False
                    self.scheduler.reap(finished)
                    st.cv.notify_all()
                # coalesce updates (`Outbox`), but deliver first tokens and ends at once
                if finished or st.urgent or time.monotonic() - last_flush >= FLUSH_INTERVAL_S:
                    st.urgent = False
                    self.flush()
                    last_flush = time.monotonic()

    def _isolate(self) -> list[Sequence]:
        """After a failed step (outside the lock, `in_step` set): rebuild the running requests'
        caches (the step may have advanced some), then step each alone until it emits; one that
        fails is aborted with the error, the others carry on. Returns the finished ones."""
        st, finished = self.state, []
        try:
            with st.cv:
                self.scheduler.rebuild_caches()
        except Exception as exc:
            for s in st.running:
                s.abort_message = s.abort_message or f"engine error: {type(exc).__name__}: {exc}"
            return []
        for s in [s for s in st.running if s.abort_message is None]:
            before, done = len(s.output_ids), []
            try:
                while not done and len(s.output_ids) == before and s.abort_message is None:
                    done = self.scheduler.step(self.decoder, [s])
            except Exception as exc:
                log.warning("request %s aborted: its step failed: %s", s.req.rid, exc)
                s.abort_message = f"engine error: {type(exc).__name__}: {exc}"
            finished += done
        return finished
