"""The engine's decode thread: apply a due weight swap, admit waiting requests, run one iteration, retire the finished
and aborted ones, deliver outputs. Everything but the forward runs under the state's lock; the forward runs with
`state.in_step` set, so callers that change the running set wait for it.

Hazard: libgomp (torch's OpenMP) all but stops its workers' spinning once the process has more OpenMP threads than
CPUs, e.g. a second thread team after the model was loaded on another thread, or a weight update loaded on an HTTP
worker thread; every small kernel of a decode step then waits for a futex wake-up (on 2 cores the server's forward took
1.7x its time alone, and 270 tok/s fell to 131-186 after a weight update). So this thread alone runs with the engine's
intra-op threads: it pins its own count when it starts (torch reads the process-wide count into a thread's OpenMP
settings on its first use), then every other thread of the process runs torch single-threaded (no second team)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from gleanrl.server.decode.decoder import Decoder
from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import EngineState
from gleanrl.server.engine.swap import WeightSwapper
from gleanrl.server.sampling.sequence import Sequence

log = logging.getLogger(__name__)
FLUSH_INTERVAL_S = 0.02  # streamed updates reach the event loop at most this late (first/last: at once)


class DecodeLoop:
    def __init__(
        self,
        state: EngineState,
        scheduler: Scheduler,
        decoder: Decoder,
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
                # coalesce updates (server/engine/bridge.py), but deliver first tokens and ends at once
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
