"""The engine's decode thread: admit waiting requests, run one scheduler iteration, retire the finished
and aborted ones, deliver outputs; weight swaps are applied between iterations. One lock (`_cv`)
guards the running set, the queue and the control flags; the forward itself runs outside it.
"""
from __future__ import annotations

import logging
import threading
import time

from gleanrl.server.scheduler import Sequence

log = logging.getLogger(__name__)
FLUSH_INTERVAL_S = 0.02  # streamed updates reach the event loop at most this late (first/last: at once)


class EngineLoop:
    """Mixin for `Engine` (which owns `_cv`, `_thread`, `_stopping`, `_paused`, `_in_step`, `_swap`, ...)."""

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gleanrl-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cv:
            if self._swap:  # an update racing the shutdown: finish it so its caller returns
                self._apply_swap()
        self.abort(None, "Server shutdown")

    def _has_work(self) -> bool:
        return not self._paused and bool(self.scheduler.running or self.scheduler.waiting)

    def _loop(self) -> None:
        last_flush = 0.0
        while True:
            with self._cv:
                while not (self._stopping or self._swap or self._has_work()):
                    self._flush()
                    self._cv.wait()
                if self._stopping:
                    return
                if self._swap:
                    self._apply_swap()
                    continue
                self.scheduler.admit()
                self._in_step = True
            finished: list[Sequence] = []
            try:
                finished = self.scheduler.step()
            except Exception as exc:  # a bug must not hang every client: fail the batch, keep serving
                log.exception("engine step failed; aborting the running batch")
                for s in self.scheduler.running:
                    s.abort_message = s.abort_message or f"engine error: {type(exc).__name__}: {exc}"
            finally:
                with self._cv:
                    self._in_step = False
                    self._reap(finished)
                    self._cv.notify_all()
                # coalesce updates (server/engine_bridge.py), but deliver first tokens and ends at once
                if finished or self.scheduler.urgent or time.monotonic() - last_flush >= FLUSH_INTERVAL_S:
                    self.scheduler.urgent = False
                    self._flush()
                    last_flush = time.monotonic()

