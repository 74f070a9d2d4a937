"""The embedded engine: token ids in, token ids out (`generate` yields deltas). Its public methods are the only door
(`tests/test_layers.py`): one `EngineState` (request sets, flags, versions, one lock) is shared by its parts, the
`Scheduler` (admission, KV slots, request lifecycle), the decoder (`server/decode/`), the `WeightSwapper` (the only code
that installs new weights) and the `DecodeLoop` (the background thread, delivering through the `Outbox`). The tokenizer
is loaded here only for stop strings and the HTTP edge. Pause modes follow SGLang's `/pause_generation`: `abort`
(in-flight requests return at once, aborted, with their partial output), `retract` (back to the queue without their KV;
rebuilt after `resume`), `in_place` (held as they are). Requests that arrive while paused wait in the queue."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator

import torch

from gleanrl.server.config import EngineConfig
from gleanrl.server.decode.sd_decoder import build_decoder
from gleanrl.server.engine.loop import DecodeLoop, Outbox
from gleanrl.server.engine.scheduler import Scheduler
from gleanrl.server.engine.state import PAUSE_MODES, EngineState, PauseMode
from gleanrl.server.engine.swap import WeightSwapper
from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.protocol import CheckpointError, GenerateOutput, GenerateRequest
from gleanrl.server.sampling.sequence import Sequence, SequenceStatus, StopChecker
from gleanrl.server.weights import checkpoint
from gleanrl.server.weights.checkpoint import NamedTensors

MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")


def _memory_tags(tags: list[str] | None) -> list[str]:
    tags = list(tags or MEMORY_TAGS)
    bad = [t for t in tags if t not in MEMORY_TAGS]
    if bad:
        raise ValueError(f"tags: {bad[0]!r} is not one of {list(MEMORY_TAGS)}")
    return tags


class Engine:
    def __init__(self, cfg: EngineConfig, outbox: Outbox | None = None):
        """`outbox`: where outputs go (`Outbox.put(key, out)`, `flush()`); the asyncio one by default, the engine
        process's pipe in `remote.py`."""
        from transformers import AutoTokenizer

        caller_threads = torch.get_num_threads()
        threads = cfg.num_threads or caller_threads
        torch.set_num_threads(1)  # load single-threaded: the decode thread alone runs with `threads` (`loop.py`)
        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        runner = ModelRunner.load(cfg.model_path, device=cfg.device, dtype=cfg.dtype)
        self.context_length = cfg.context_length or int(getattr(runner.config, "max_position_embeddings", 4096))
        self.eos_ids = self._eos_ids(runner)
        self.state = EngineState(draft_weight_version="default" if cfg.drafter else None)
        self.scheduler = Scheduler(self.state, runner, cfg.max_running_requests, context_length=self.context_length)
        config = checkpoint.read_config(cfg.model_path)
        self.decoder = build_decoder(cfg, runner, config, lambda: self.state.weight_version)
        self.swapper = WeightSwapper(cfg, config, self.state, self.scheduler, self.decoder)
        self._released: set[str] = set()  # memory tags released and not resumed
        self._rng = torch.Generator().manual_seed(cfg.seed)  # for requests without a seed
        self._outbox = outbox or Outbox()
        self.loop = DecodeLoop(self.state, self.scheduler, self.decoder, self.swapper, self._outbox.flush, threads)
        torch.set_num_threads(caller_threads)

    def _eos_ids(self, runner: ModelRunner) -> set[int]:
        ids: set[int] = set()
        gen = getattr(runner.model, "generation_config", None)
        for src in (runner.config.eos_token_id, getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            ids |= set(src) if isinstance(src, (list, tuple)) else ({src} if src is not None else set())
        return ids

    def start(self) -> None:
        self.loop.start()

    def alive(self) -> bool:
        """False once the decode thread has died (it never should: a failing step is isolated, `loop.py`)."""
        return self.loop.thread is None or self.loop.thread.is_alive()

    def shutdown(self) -> None:
        self.loop.stop()
        with self.state.cv:
            if self.state.swap is not None:
                self.swapper.apply()  # an update racing the shutdown: finish it so its caller returns
        self.abort(None, "Server shutdown")

    # ---- requests -----------------------------------------------------------------------------
    def _validate(self, req: GenerateRequest) -> None:
        ids, vocab = req.input_ids, self.scheduler.runner.vocab_size
        if not ids:
            raise ValueError("input_ids must not be empty")
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise ValueError(f"input_ids must be token ids in [0, {vocab})")
        if len(ids) >= self.context_length:
            raise ValueError(
                f"The input ({len(ids)} tokens) is longer than the model's "
                f"context length ({self.context_length} tokens)."
            )

    def submit(self, req: GenerateRequest, key) -> None:
        """Queue `req` (ValueError if refused); its outputs go to `outbox.put(key, out)` from the decode thread."""
        self._validate(req)
        emit = functools.partial(self._outbox.put, key)
        gen = torch.Generator().manual_seed(req.params.seed) if req.params.seed is not None else self._rng
        seq = Sequence(req, emit, StopChecker(req.params, self.eos_ids, self.context_length, self.tokenizer), gen)
        st = self.state
        with st.cv:
            if req.rid in st.rids:
                raise ValueError(f"rid {req.rid!r} is already running")
            if st.stopping:
                self.scheduler.emit(seq, "Server shutdown")
            elif req.params.max_new_tokens == 0 and seq.prompt_scores is None:  # nothing to compute
                seq.finish_reason = {"type": "length", "length": 0}
                self.scheduler.emit(seq)
            else:
                st.rids.add(req.rid)
                seq.status = SequenceStatus.HELD if self.swapper.draining() else SequenceStatus.WAITING
                (st.held if seq.status is SequenceStatus.HELD else st.waiting).append(seq)
                st.cv.notify_all()
        self._outbox.flush()

    async def generate(self, req: GenerateRequest) -> AsyncIterator[GenerateOutput]:
        queue: asyncio.Queue = asyncio.Queue()
        self.submit(req, (asyncio.get_running_loop(), queue))
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
        """Abort one request (or all): queued ones at once, running ones at the next iteration boundary."""
        st = self.state
        with st.cv:
            queued = [s for q in (st.waiting, st.held) for s in q if rid is None or s.req.rid == rid]
            for s in queued:
                (st.held if s.status is SequenceStatus.HELD else st.waiting).remove(s)
                self.scheduler.finish(s, message)
            running = [s for s in st.running if (rid is None or s.req.rid == rid) and s.abort_message is None]
            for s in running:
                s.abort_message = message
            if not st.in_step:
                self.scheduler.reap()
            st.cv.notify_all()
        self._outbox.flush()
        return len(queued) + len(running)

    # ---- control ------------------------------------------------------------------------------
    def update_weights(
        self,
        source: str | NamedTensors,
        weight_version: str | None = None,
        selector: str = "target",
        flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> None:
        """The one entrance for weight updates. `source`: a checkpoint directory (a disk update) or named tensors (a
        tensor or process-group update: names it leaves out keep their values; `server/weights/checkpoint.py`). Load
        and check in this thread, then swap between iterations (`server/engine/swap.py`); a target swap waits for
        running requests unless paused or they are aborted. CheckpointError when refused: old weights keep serving."""
        sw = self.swapper
        if selector not in ("target", "draft"):
            raise CheckpointError(f"selector must be 'target' or 'draft', got {selector!r}")
        if isinstance(source, str) and selector == "draft":
            swap = sw.load_draft(source, weight_version)
        elif isinstance(source, str):
            swap = sw.load_target(source, weight_version, flush_cache)
        else:
            swap = sw.load_tensors(selector, source, weight_version, flush_cache)
        if abort_all_requests:
            self.abort(None, "Abort all requests for a weight update")
        sw.submit(swap, apply_now=self.loop.thread is None)

    def tensor_signature(self, selector: str) -> checkpoint.Signature:
        """The tensors an update of `selector` may carry (CheckpointError when there is nothing to update)."""
        return self.swapper.expected(selector)

    def check_tensor_list(self, selector: str, names: list[str], shapes: list) -> None:
        """Before buffers are allocated: CheckpointError unless the listed tensors could be an
        update of `selector`'s model (no more tensors nor elements than it holds)."""
        checkpoint.check_volume(self.tensor_signature(selector), selector, names, shapes)

    def check_tensors(self, selector: str, named: NamedTensors) -> None:
        """Each tensor update's check on arrival, before it waits for the engine (`checkpoint.check_update`)."""
        checkpoint.check_update(self.tensor_signature(selector), selector, named)

    def release_memory(self, tags: list[str] | None) -> None:
        """SGLang's /release_memory_occupation (`tags`: kv_cache, weights, cuda_graph; none means all), for co-located
        RL; ValueError if refused. As SGLang, refused unless the server is idle, and generation needs everything resumed
        (a clear 400 instead of SGLang's undefined behaviour). kv_cache: the slot pool is dropped (and the CUDA cache
        emptied), rebuilt on resume. weights: on the CPU only the semantics hold (no accelerator memory to give back);
        on CUDA refused by name (not implemented). cuda_graph: none is captured. The drafter is never touched, so it
        survives a release/resume cycle (stock SGLang loses it, SGLang #31674); weight updates stay allowed."""
        tags = _memory_tags(tags)
        if "weights" in tags and self.cfg.device == "cuda":
            raise ValueError(
                "tags: releasing 'weights' on CUDA is not implemented by the embedded backend; release 'kv_cache' only"
            )
        st = self.state
        with st.cv:
            if st.running or st.waiting or st.held:
                raise ValueError("release_memory_occupation should be called only when server is idle.")
            if "kv_cache" in tags:
                self.scheduler.pool = None  # its memory goes back; new requests get caches of their own
            self._released |= set(tags)
        if "kv_cache" in tags and self.cfg.device == "cuda":
            torch.cuda.empty_cache()

    def resume_memory(self, tags: list[str] | None) -> None:
        tags = _memory_tags(tags)
        with self.state.cv:
            if "kv_cache" in tags and "kv_cache" in self._released:
                self.scheduler.restore_pool()
            self._released -= set(tags)

    def released_memory(self) -> set[str]:
        """The tags released and not resumed yet (generation is refused while any is)."""
        return set(self._released)

    def pause(self, mode: PauseMode = "abort") -> int:
        """Stop scheduling iterations (SGLang's modes, module docstring); returns once the iteration
        in flight is done, with the number of requests aborted or retracted."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        st = self.state
        with st.cv:
            st.paused = mode
            st.cv.wait_for(lambda: not st.in_step)
            retracted = self.scheduler.retract() if mode == "retract" else 0
        return self.abort(None, "Abort by pause_generation") if mode == "abort" else retracted

    def resume(self) -> None:
        with self.state.cv:
            self.state.paused = None
            self.state.cv.notify_all()

    def flush_cache(self) -> bool:
        """As SGLang: succeeds only when no request is running, nor waiting unless generation is paused (retracted
        requests rebuild their KV anyway; there is no prefix cache here to drop)."""
        st = self.state
        with st.cv:
            return not st.running and (st.paused is not None or not st.waiting)

    def info(self) -> dict:
        sw = self.swapper
        return {
            "model_path": sw.model_path,
            "tokenizer_path": self.cfg.model_path,
            "weight_version": self.state.weight_version,
            "draft_model_path": self.decoder.draft_path,
            "draft_weight_version": self.state.draft_weight_version,
            "context_length": self.context_length,
            "max_running_requests": self.cfg.max_running_requests,
            "is_generation": True,
            "vocab_size": self.scheduler.runner.vocab_size,
            "architectures": sw.config.get("architectures"),
            "device": self.cfg.device,
        }

    def used_tokens(self) -> int:
        """KV tokens of the running set (a snapshot read without the lock: a gauge)."""
        return sum(s.total_len for s in list(self.state.running))

    def sd_counters(self) -> dict:
        """The decoder's cumulative counts since start (`decode/iteration.py`'s `DecodeCounters`)."""
        return dataclasses.asdict(self.decoder.counters)

    def stats(self) -> dict:
        """`avg_spec_accept_length`: tokens per verify pass over verify passes only (as SGLang's scheduler: accepted
        drafts + passes over passes); `avg_tokens_per_target_pass`: every output token over every target pass, plain and
        prefill passes included (each pass emits one token beyond the drafts it accepted)."""
        st = self.state
        with st.cv:
            tokens = st.generation_tokens_total
            stats = {
                "num_running_reqs": len(st.running),
                "num_queue_reqs": len(st.waiting) + len(st.held),
                "paused": st.paused is not None,
                "generation_tokens_total": tokens,
                **self.decoder.stats(),
            }
        accepted = self.decoder.counters.verify_tokens - self.decoder.counters.verify_ct
        stats["avg_tokens_per_target_pass"] = tokens / (tokens - accepted) if tokens > accepted else 0.0
        return stats
