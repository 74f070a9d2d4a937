"""The engine in a process of its own (`gleanrl serve`'s default; `--no-engine-process` embeds it). `EngineProcess` has
`Engine`'s public methods and forwards each over a socket pair to a child process that holds the one `Engine`
(`child.py`).

Why: the HTTP process parses, checks and refuses what clients send (JSON, base64 tensors, chunked bodies). In one
process that work holds the GIL the decode thread needs between its ops, so one hostile client slowed every benign one
(docs/reliability.md); here the decode thread shares its GIL only with the child's reader, as SGLang's scheduler runs
apart from its tokenizer manager.

Wire: length-framed pickles (`multiprocessing.connection.Connection`; plain pickle, so tensors travel by value).
Parent -> child: the `EngineConfig` once, then ("submit", cid, request, grammar JSON | None), ("abort", rid, message),
("call", cid, name, args, kwargs). Child -> parent: ("ready", hello) or ("failed", message) once, ("out", [(cid,
output), ...]) per flush of the decode loop, ("done" | "error", cid, value) per call or refused submit.
Invariant: the child's reader handles submit, abort and the quick calls in arrival order, so an abort sent after a
submit finds its request; calls that wait (a weight update drains, a pause waits for the iteration in flight) run on a
pool. Tensor updates are checked in this process against the child's signature (`check_tensors`), so a refused one
never crosses to the engine's. A child that exits fails every waiting call and stream with `EngineGone` and calls
`on_exit` (`gleanrl serve` then stops, so whoever runs it sees the exit); a parent that exits closes the socket, and
the child stops with it."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection

from gleanrl.server.config import EngineConfig
from gleanrl.server.protocol import GenerateOutput, GenerateRequest
from gleanrl.server.weights import checkpoint
from gleanrl.server.weights.checkpoint import NamedTensors

log = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 600.0
# answered by the child's reader at once (quick; ordered with submit and abort)
QUICK = ("start", "stats", "info", "used_tokens", "released_memory", "flush_cache", "resume", "sd_counters")
# answered on the child's pool (each may wait: for a drain, the iteration in flight, a checkpoint's load)
SLOW = (
    "update_weights",
    "tensor_signature",
    "pause",
    "release_memory",
    "resume_memory",
    "shutdown",
)


class EngineGone(RuntimeError):
    """The engine process has exited: nothing can be served."""


class Wire:
    """One end of the socket pair: whole messages; several threads may send."""

    def __init__(self, fd: int):
        self.conn = Connection(fd)
        self._lock = threading.Lock()

    def send(self, msg) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.conn.send_bytes(data)

    def recv(self):
        return pickle.loads(self.conn.recv_bytes())


def _deliver(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


class EngineProcess:
    """`Engine`'s public methods, served by a child process (module docstring). `abort` does not wait for the child."""

    def __init__(self, cfg: EngineConfig, on_exit: Callable[[], None] | None = None):
        from transformers import AutoTokenizer

        ours, theirs = socket.socketpair()
        code = f"from gleanrl.server.engine.child import child_main; child_main({theirs.fileno()})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),))
        theirs.close()
        self._wire = Wire(ours.detach())
        self.cfg = cfg
        try:
            self._wire.send((cfg, logging.getLogger().level))
            self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)  # the edge's, loaded while the child loads
            hello = self._hello()
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            self._wire.conn.close()
            raise
        self.context_length, self.eos_ids = hello["context_length"], set(hello["eos_ids"])
        self._on_exit = on_exit
        self._ids = itertools.count()
        self._lock = threading.Lock()  # guards the two tables and `_gone`
        self._calls: dict[int, Future] = {}
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._gone: str | None = None
        self._closing = False
        threading.Thread(target=self._read, name="gleanrl-engine-reader", daemon=True).start()

    def _hello(self) -> dict:
        if not self._wire.conn.poll(STARTUP_TIMEOUT_S):
            raise EngineGone(f"the engine process did not start in {STARTUP_TIMEOUT_S:.0f} s")
        try:
            kind, hello = self._wire.recv()
        except EOFError:
            raise EngineGone(f"the engine process exited while starting (code {self.proc.wait()})") from None
        if kind != "ready":
            raise EngineGone(hello)
        return hello

    # ---- the engine's methods ----------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> AsyncIterator[GenerateOutput]:
        queue: asyncio.Queue = asyncio.Queue()
        cid = self._open(self._streams, (asyncio.get_running_loop(), queue))
        finished = False
        try:
            self._send(("submit", cid, *_outgoing(req)))
            while not finished:
                out = await queue.get()
                if isinstance(out, BaseException):  # refused or gone: nothing of this request runs in the child
                    finished = True  # (an abort by rid would end another request, already running under it)
                    raise out
                finished = out.finished
                yield out
        finally:
            with self._lock:
                self._streams.pop(cid, None)
            if not finished:
                self.abort(req.rid)

    def abort(self, rid: str | None = None, message: str = "Abort requested") -> None:
        try:
            self._send(("abort", rid, message))
        except EngineGone:  # nothing runs any more
            pass

    def alive(self) -> bool:
        return self._gone is None

    def shutdown(self) -> None:
        self._closing = True
        try:
            self._call("shutdown")
        except EngineGone:
            pass
        # both readers see the end (a close would not wake this process's, blocked in recv); the child then exits
        with socket.socket(fileno=os.dup(self._wire.conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def check_tensors(self, selector: str, named: NamedTensors) -> None:
        """Checked here against the child's signature: a refused update never crosses to the engine's process."""
        checkpoint.check_update(self.tensor_signature(selector), selector, named)

    def check_tensor_list(self, selector: str, names: list[str], shapes: list) -> None:
        checkpoint.check_volume(self.tensor_signature(selector), selector, names, shapes)

    def _call(self, name: str, *args, **kwargs):
        fut: Future = Future()
        cid = self._open(self._calls, fut)
        self._send(("call", cid, name, args, kwargs))
        return fut.result()

    # ---- plumbing ------------------------------------------------------------------------------
    def _open(self, table: dict, entry) -> int:
        with self._lock:
            if self._gone is not None:
                raise EngineGone(self._gone)
            cid = next(self._ids)
            table[cid] = entry
        return cid

    def _send(self, msg) -> None:
        try:
            self._wire.send(msg)
        except OSError:
            raise EngineGone(self._gone or "the engine process has exited") from None

    def _read(self) -> None:
        try:
            while True:
                msg = self._wire.recv()
                if msg[0] == "out":
                    self._route(msg[1])
                    continue
                kind, cid, value = msg
                with self._lock:
                    fut, stream = self._calls.pop(cid, None), self._streams.get(cid)
                if fut is not None:
                    fut.set_result(value) if kind == "done" else fut.set_exception(value)
                elif stream is not None:  # a refused submit
                    self._route([(cid, value)])
        except (EOFError, OSError):
            pass
        except Exception:  # a message that does not unpickle: nothing after it can be trusted
            log.exception("unreadable message from the engine process; stopping it")
            self.proc.kill()
        self._fail(self.proc.wait())

    def _route(self, items: list[tuple[int, object]]) -> None:
        """Each output to its stream's queue, one hand-over per event loop."""
        by_loop: dict = {}
        with self._lock:
            for cid, item in items:
                if (stream := self._streams.get(cid)) is not None:
                    by_loop.setdefault(stream[0], []).append((stream[1], item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # that loop is closed: nobody listens any more
                pass

    def _fail(self, code: int) -> None:
        with self._lock:
            self._gone = f"the engine process has exited (code {code})"
            calls, streams = list(self._calls.values()), list(self._streams.items())
            self._calls.clear()
        for fut in calls:
            fut.set_exception(EngineGone(self._gone))
        self._route([(cid, EngineGone(self._gone)) for cid, _ in streams])
        if not self._closing:
            log.error("%s; the server stops", self._gone)
            if self._on_exit is not None:
                self._on_exit()


def _forward(name: str):
    def method(self, *args, **kwargs):
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    return method


for _name in QUICK + SLOW:
    if _name != "shutdown":
        setattr(EngineProcess, _name, _forward(_name))


def _outgoing(req: GenerateRequest) -> tuple[GenerateRequest, str | None]:
    """The request without its compiled grammar (not picklable) and that grammar as xgrammar's JSON."""
    grammar = req.params.grammar
    if grammar is None:
        return req, None
    return dataclasses.replace(req, params=dataclasses.replace(req.params, grammar=None)), grammar.serialize_json()
