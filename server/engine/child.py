"""The engine process's side of `remote.py` (`gleanrl serve`'s child, started by `EngineProcess`): the one `Engine`,
its decode thread, a reader that handles submits, aborts and quick calls in arrival order, and a pool for the calls
that wait. Outputs leave once per flush of the decode loop (`PipeOutbox`)."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from gleanrl.server.engine.remote import QUICK, Wire
from gleanrl.server.protocol import GenerateOutput


class PipeOutbox:
    """The child's `Outbox`: outputs keyed by the parent's stream id, one message per flush."""

    def __init__(self, wire: Wire):
        self._wire = wire
        self._items: deque = deque()
        self._lock = threading.Lock()  # one flusher at a time keeps each stream's outputs in order

    def put(self, cid: int, out: GenerateOutput) -> None:
        self._items.append((cid, out))

    def flush(self) -> None:
        with self._lock:
            items = [self._items.popleft() for _ in range(len(self._items))]
            try:
                if items:
                    self._wire.send(("out", items))
            except OSError:  # the parent has gone: nobody to deliver to (the reader stops the child)
                pass


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _answer(wire: Wire, cid: int, fn, args, kwargs) -> None:
    try:
        reply = ("done", cid, fn(*args, **kwargs))
    except Exception as exc:
        reply = ("error", cid, _portable(exc))
    try:
        wire.send(reply)
    except OSError:  # the parent has gone
        pass


class _Grammars:
    """Compiled grammars back from xgrammar's JSON, with the edge's tokenizer info (`http/generate/grammar.py`)."""

    def __init__(self, engine):
        self.engine, self.info = engine, None

    def load(self, text: str):
        import xgrammar as xgr

        if self.info is None:
            e = self.engine
            vocab = int(e.info().get("vocab_size") or len(e.tokenizer))
            self.info = xgr.TokenizerInfo.from_huggingface(
                e.tokenizer, vocab_size=vocab, stop_token_ids=sorted(e.eos_ids) or None
            )
        return xgr.CompiledGrammar.deserialize_json(text, self.info)


def child_main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops this process
    wire = Wire(fd)
    cfg, level = wire.recv()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s (engine): %(message)s")
    from gleanrl.server.engine.engine import Engine

    try:
        engine = Engine(cfg, outbox=PipeOutbox(wire))
    except Exception as exc:
        wire.send(("failed", f"{type(exc).__name__}: {exc}".splitlines()[0]))
        os._exit(1)
    from gleanrl.base.heap import freeze_heap

    freeze_heap()  # a server process of its own: its collections must not walk torch's and the model's objects
    wire.send(("ready", {"context_length": engine.context_length, "eos_ids": sorted(engine.eos_ids)}))
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gleanrl-engine-call")
    grammars = _Grammars(engine)
    while True:
        try:
            msg = wire.recv()
        except (EOFError, OSError):  # the parent has gone (or closed the socket after shutdown)
            break
        kind = msg[0]
        if kind == "submit":
            _, cid, req, grammar = msg
            try:
                if grammar is not None:
                    req.params.grammar = grammars.load(grammar)
                engine.submit(req, cid)
            except Exception as exc:
                wire.send(("error", cid, _portable(exc)))
        elif kind == "abort":
            engine.abort(msg[1], msg[2])
        elif kind == "call":
            _, cid, name, args, kwargs = msg
            job = (wire, cid, getattr(engine, name), args, kwargs)  # the parent calls only QUICK and SLOW names
            _answer(*job) if name in QUICK else pool.submit(_answer, *job)
    engine.shutdown()
    os._exit(0)  # the pool's threads may still wait on a drain that will never come
