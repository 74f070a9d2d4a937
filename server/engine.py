"""The embedded engine: a background decode thread over the scheduler, bridged to asyncio.

Requests are token ids in, token ids out (`generate` yields deltas); the tokenizer is loaded here only
for stop strings and for the HTTP edge. Everything that changes the running set (admission, aborts,
weight swaps) happens under one lock between iterations; the forward itself runs outside the lock.
"""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator

import torch

from gleanrl.server import draft_swap, weights
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine_bridge import Outbox
from gleanrl.server.engine_control import EngineControl
from gleanrl.server.engine_loop import EngineLoop
from gleanrl.server.model_runner import ModelRunner
from gleanrl.server.protocol import GenerateOutput, GenerateRequest
from gleanrl.server.scheduler import Scheduler, Sequence
from gleanrl.server.stopping import StopChecker



class Engine(EngineLoop, EngineControl):
    """See the module docstring; the decode thread lives in `EngineLoop`, weights, pause and stats in
    `EngineControl`."""

    def __init__(self, cfg: EngineConfig):
        from transformers import AutoTokenizer

        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        self.cfg = cfg
        self.model_path = cfg.model_path
        self._config = weights.read_config(cfg.model_path)
        self._signature = weights.checkpoint_signature(cfg.model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        runner = ModelRunner.load(cfg.model_path, device=cfg.device, dtype=cfg.dtype)
        self.context_length = cfg.context_length or int(getattr(runner.config, "max_position_embeddings", 4096))
        self.eos_ids = self._eos_ids(runner)
        self.scheduler = Scheduler(runner, cfg.max_running_requests, context_length=self.context_length)
        self.spec = draft_swap.install(self.scheduler, cfg, self._config)  # SD step (plain until a drafter)
        self._rng = torch.Generator().manual_seed(cfg.seed)  # for requests without a seed
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = self._paused = self._in_step = False
        self._swap: dict | None = None
        self._rids: set[str] = set()
        self._outbox = Outbox()
        self._flush = self._outbox.flush

    def _eos_ids(self, runner: ModelRunner) -> set[int]:
        ids: set[int] = set()
        gen = getattr(runner.model, "generation_config", None)
        for src in (runner.config.eos_token_id, getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            ids |= set(src) if isinstance(src, (list, tuple)) else ({src} if src is not None else set())
        return ids

    # ---- requests -----------------------------------------------------------------------------
    def _validate(self, req: GenerateRequest) -> None:
        ids, vocab = req.input_ids, self.scheduler.runner.vocab_size
        if not ids:
            raise ValueError("input_ids must not be empty")
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise ValueError(f"input_ids must be token ids in [0, {vocab})")
        if len(ids) >= self.context_length:
            raise ValueError(f"The input ({len(ids)} tokens) is longer than the model's context length "
                             f"({self.context_length} tokens).")

    async def generate(self, req: GenerateRequest) -> AsyncIterator[GenerateOutput]:
        self._validate(req)
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def emit(out: GenerateOutput) -> None:
            self._outbox.put(loop, queue, out)

        seed = req.params.seed
        gen = torch.Generator().manual_seed(seed) if seed is not None else self._rng
        seq = Sequence(req, emit, StopChecker(req.params, self.eos_ids, self.context_length, self.tokenizer), gen)
        with self._cv:
            if req.rid in self._rids:
                raise ValueError(f"rid {req.rid!r} is already running")
            if self._stopping:
                self.scheduler.emit(seq, "Server shutdown")
            elif req.params.max_new_tokens == 0:
                seq.finish_reason = {"type": "length", "length": 0}
                self.scheduler.emit(seq)
            else:
                self._rids.add(req.rid)
                self.scheduler.waiting.append(seq)
                self._cv.notify_all()
        self._flush()
        finished = False
        try:
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(req.rid)

    def abort(self, rid: str | None = None, message: str = "Abort requested") -> int:
        with self._cv:
            sched = self.scheduler
            hit = [s for s in sched.waiting if rid is None or s.req.rid == rid]
            for s in hit:
                sched.waiting.remove(s)
                self._finish(s, message)
            running = [s for s in sched.running if (rid is None or s.req.rid == rid) and s.abort_message is None]
            for s in running:
                s.abort_message = message
            if not self._in_step:
                self._reap()
            self._cv.notify_all()
        self._flush()
        return len(hit) + len(running)

    def _finish(self, seq: Sequence, abort_message: str | None = None) -> None:
        """Under the lock, once removed from the running set: free its cache and rid, send its last update."""
        self.scheduler.free_cache(seq)
        self._rids.discard(seq.req.rid)
        self.scheduler.emit(seq, abort_message)

    def _reap(self, finished: list[Sequence] = ()) -> None:
        done = set(map(id, finished))
        gone = [s for s in self.scheduler.running if id(s) in done or s.abort_message is not None]
        self.scheduler.running = [s for s in self.scheduler.running if s not in gone]
        for s in gone:
            self._finish(s, None if id(s) in done else s.abort_message)
