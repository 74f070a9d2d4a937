"""The engine's control surface: weight updates, pause/resume, cache flush, info and stats.

A weight update validates and loads the new checkpoint in the caller's thread (the serving model keeps
decoding meanwhile), then hands it to the decode thread, which swaps it in between two iterations.
With `flush_cache` the running requests' KV caches are dropped and rebuilt from their prefixes under
the new weights, so every token after the swap is the new model's; without it they keep the old KV.
"""
from __future__ import annotations

import threading

from gleanrl.server import draft_swap, weights
from gleanrl.server.protocol import CheckpointError


class EngineControl:
    """Mixin for `Engine` (which owns `_cv`, `_swap`, `_paused`, `scheduler`, `_thread`, ...)."""

    def update_weights(self, model_path: str, weight_version: str | None = None, selector: str = "target",
                       flush_cache: bool = True, abort_all_requests: bool = False) -> None:
        if selector not in ("target", "draft"):
            raise CheckpointError(f"selector must be 'target' or 'draft', got {selector!r}")
        if selector == "draft":  # server/draft_swap.py: loaded and checked here, applied between iterations
            swap = draft_swap.prepare(self.spec, model_path, weight_version, self._config)
            swap["done"] = threading.Event()
        else:
            runner, config, sig = weights.load_checked(model_path, self._config, self._signature,
                                                       self.cfg.device, self.cfg.dtype)
            swap = {"runner": runner, "config": config, "sig": sig, "path": model_path,
                    "version": weight_version, "flush": flush_cache, "abort": abort_all_requests,
                    "done": threading.Event()}
        with self._cv:
            if self._swap is not None:
                raise CheckpointError("another weight update is in progress")
            self._swap = swap
            if self._thread is None:
                self._apply_swap()
            self._cv.notify_all()
        swap["done"].wait()

    def _apply_swap(self) -> None:
        """Under the lock, between iterations."""
        swap, self._swap = self._swap, None
        if "apply" in swap:  # a drafter swap
            swap["apply"]()
            swap["done"].set()
            return
        if swap["abort"]:
            self.abort(None, "Abort all requests for a weight update")
        sched = self.scheduler
        sched.runner = swap["runner"]
        if swap["version"] is not None:  # as SGLang: no version given keeps the current one
            sched.weight_version = swap["version"]
        self.model_path, self._config, self._signature = swap["path"], swap["config"], swap["sig"]
        if swap["flush"]:
            for s in sched.running:
                sched.free_cache(s)
                s.cache = sched.new_cache(s)
        swap["done"].set()

    def pause(self) -> None:
        """Stop scheduling iterations (requests stay); returns once the iteration in flight is done."""
        with self._cv:
            self._paused = True
            self._cv.wait_for(lambda: not self._in_step)

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def flush_cache(self) -> bool:
        """As SGLang: succeeds only when no request is running or waiting (there is no prefix cache to
        drop here; per-request KV is freed when a request finishes)."""
        with self._cv:
            return not (self.scheduler.running or self.scheduler.waiting)

    def info(self) -> dict:
        return {"model_path": self.model_path, "tokenizer_path": self.cfg.model_path,
                "weight_version": self.scheduler.weight_version,
                "draft_model_path": self.spec.draft_path, "draft_weight_version": self.scheduler.draft_weight_version,
                "context_length": self.context_length, "max_running_requests": self.cfg.max_running_requests,
                "is_generation": True, "vocab_size": self.scheduler.runner.vocab_size,
                "architectures": self._config.get("architectures"), "device": self.cfg.device}

    def stats(self) -> dict:
        sched = self.scheduler
        return {"num_running_reqs": len(sched.running), "num_queue_reqs": len(sched.waiting),
                "paused": self._paused, "generation_tokens_total": sched.generation_tokens_total,
                "avg_spec_accept_length": self.spec.avg_accept_length,
                "spec_accept_histogram": list(self.spec.accept_hist)}
