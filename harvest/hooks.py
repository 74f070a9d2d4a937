"""The Harvester behind the trainer's hooks: every hook of `trainer.hooks.RolloutHooks`, structurally
(`harvest` never imports `trainer`; `tests/test_harvester_hooks.py` checks the match).

`on_rollout_finished` runs in the trainer's event loop: it only records the rollout. `update_capture()`: the
update's forward hands over aux states and soft labels of the rollouts it trains on, by the version that sampled
them, at no extra forward (spooled next window); those it skips (zero-advantage groups) join the idle queue (at
most `max_queue`, oldest dropped and counted), captured if time allows by the policy then current (tokens one
version older: EAGLE's data is never on-policy). `idle_window()`: a thread that spools update captures, captures
queued rollouts and trains the drafter one micro-step at a time (alternating once the spool is warm), pushing
every `push_every` steps, only on the cores `bind_cores` names free; leaving it stops it within one micro-step.
Early finishers are captured mid-step with `mid_step_capture`, and anyway while the spool holds < `batch_size`
samples or no `update_capture()` came yet (e.g. the sidecar).

Resume: `state_dict()` (the Harvester's, the queue, unspooled captures as tokens) is in every trainer checkpoint;
after `load_state_dict()` the serving drafter is pushed again (`bind_push`): a crash may fall between writing and
pushing it.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from gleanrl.harvest.capture import FinishedRollout, Sample, UpdateCapture
from gleanrl.harvest.checkpoint import drafter_dir
from gleanrl.harvest.config import read_config
from gleanrl.harvest.harvester import Harvester
from gleanrl.harvest.idle import CoreGate, IdleWindow, busy_step


class HarvestHooks:
    harvests = True  # the trainer lays its servers out for a harvest (trainer.layout), shows harvest columns

    def __init__(self, harvester: Harvester, max_queue: int = 512):
        self.h, self.max_queue = harvester, max_queue
        self._turn = False  # the idle window alternates capture and training
        self._queue: collections.deque = collections.deque()  # (prompt_ids, output_ids) for the idle window
        self._fresh: dict[int, FinishedRollout] = {}  # this step's uncaptured finishers, by id (insertion order)
        self._ready: collections.deque = collections.deque()  # (Sample, version) from the update: to spool
        self._lock = threading.Lock()  # _fresh: the event loop adds, the idle thread may take
        self._updates_capture = False  # set by the first update_capture(): the update takes the fresh
        self._model: torch.nn.Module | None = None
        self._windows: list[IdleWindow] = []
        self._cores: CoreGate | None = None
        self._version, self._tokens, self._repush = 0, [0, 0], False
        self._start = (0, 0, harvester.version, 0, 0, 0)  # counters at the step's start
        self.captured = self.dropped = self.errors = self.update_captured = 0
        self.capture_s = self._capture_s0 = 0.0  # idle time spent capturing (the rest of the used idle time trains)

    @classmethod
    def for_run(cls, model: str, drafter: str, root: Path, resume: bool) -> tuple[HarvestHooks, Path]:
        """Hooks over `root` (spool, drafter versions; settings in `root/harvest_config.json`) and the drafter to
        serve: the newest pushed version, else `drafter`."""
        if not resume and any((root / "drafter_versions").glob("v*")):
            raise ValueError(f"{root} holds drafter versions of an earlier run: pass --resume, or use another --out")
        h = Harvester(model, drafter, root / "spool", cfg=read_config(root))
        return cls(h), (drafter_dir(h.versions_dir, h.version) if h.version else Path(drafter))

    def bind_push(self, push: Callable[[str, int], None]) -> None:
        """Use the trainer's `push(path, version)` if the Harvester has none; on resume, push the serving one again."""
        if self.h.push is None:
            self.h.push = push
        path = drafter_dir(self.h.versions_dir, self.h.version)
        if self._repush and self.h.version and path.is_dir():
            try:
                self.h.push_checkpoint(str(path), self.h.version)
            except Exception as exc:
                # the next push replaces it; RL must not stop
                print(f"warning: re-pushing drafter v{self.h.version} after resume failed: {exc}", file=sys.stderr)
        self._repush = False

    def bind_cores(self, cores: CoreGate | None) -> None:
        """Train only on the cores `cores()` names free (None: beside the server, at `idle_nice`)."""
        self._cores = cores

    def scheduling_probe(self) -> IdleWindow:
        """The harvester's kind of compute at its priority (`idle_nice`), for the start-up check."""
        return IdleWindow(busy_step(), nice=self.h.cfg.idle_nice, name="gleanrl-probe")

    def state_dict(self) -> dict:
        ready = [(s.input_ids[~s.loss_mask].tolist(), s.input_ids[s.loss_mask].tolist()) for s, _ in self._ready]
        fresh = [(list(r.prompt_ids), list(r.output_ids)) for r in self._fresh.values()]
        queue = [list(map(list, q)) for q in [*ready, *fresh, *self._queue]]
        return {"harvester": self.h.state_dict(), "queue": queue, "counts": (self.captured, self.dropped, self.errors)}

    def load_state_dict(self, state: dict) -> None:
        self.h.load_state_dict(state["harvester"])
        self._queue = collections.deque(tuple(q) for q in state["queue"])
        self.captured, self.dropped, self.errors = state["counts"]
        self._repush = True

    def on_step_start(self, step: int, model: torch.nn.Module) -> None:
        # the policy that samples step N is version N-1
        self._model, self._version = model, step - 1
        self._carry_fresh()  # a loop without update_capture(): the idle window captures them
        self._windows = []
        self._tokens = [0, 0]  # this step's output tokens: all, from SD
        h = self.h
        self._start = (self.captured, h.steps, h.version, len(h.history), self.dropped, self.update_captured)
        self._capture_s0 = self.capture_s
        # the boundary (counted in this step): no rollout runs, so a swap costs nothing
        try:
            self.h.new_step()
        except Exception as exc:
            self.h.push_failed(exc)

    def on_rollout_finished(self, rollout: FinishedRollout) -> None:
        with self._lock:
            self._fresh[id(rollout)] = rollout
            overflow = self._fresh.pop(next(iter(self._fresh))) if len(self._fresh) > self.max_queue else None
        if overflow is not None:
            # a step larger than the queue: its oldest wait for the idle window
            self._carry([overflow])
        n = len(rollout.output_ids)
        self._tokens[0] += n
        self._tokens[1] += min(n, rollout.sd_tokens)

    @contextlib.contextmanager
    def update_capture(self) -> Iterator[UpdateCapture]:
        """Open around the policy update; on leaving, what it did not capture joins the idle queue."""

        def wants(rollout: FinishedRollout) -> bool:
            with self._lock:
                return self._fresh.pop(id(rollout), None) is not None

        def put(rollout: FinishedRollout, sample: Sample) -> None:
            self._ready.append((sample, self._version))
            self.update_captured += 1

        self._updates_capture = True
        try:
            yield UpdateCapture(
                self.h.layer_ids, self.h.cfg.topk, getattr(torch, self.h.cfg.aux_dtype), self._version, wants, put
            )
        finally:
            self._carry_fresh()

    def _carry_fresh(self) -> None:
        with self._lock:
            fresh, self._fresh = list(self._fresh.values()), {}
        self._carry(fresh)

    def _carry(self, rollouts: list[FinishedRollout]) -> None:
        for r in rollouts:
            self._queue.append((list(r.prompt_ids), list(r.output_ids)))
        while len(self._queue) > self.max_queue:
            self._queue.popleft()
            self.dropped += 1

    def _mid_step(self) -> bool:
        """Capture this step's finishers in the idle window: asked for, no update takes them (yet), or a cold spool."""
        cfg = self.h.cfg
        return cfg.mid_step_capture or not self._updates_capture or len(self.h.spool) < cfg.batch_size

    def _next_capture(self) -> tuple[list[int], list[int]] | None:
        with self._lock:
            if self._fresh and self._mid_step():
                r = self._fresh.pop(next(iter(self._fresh)))
                return list(r.prompt_ids), list(r.output_ids)
        return self._queue.popleft() if self._queue else None

    def _capture_one(self) -> bool:
        ready = self._ready.popleft() if self._ready else None
        self._turn ^= True
        if ready is None and self._turn and len(self.h.spool) >= self.h.cfg.batch_size:
            # a warm spool: a capture forward every other micro-step, training in between
            return False
        item = None if ready else self._next_capture()
        if ready is None and item is None:
            return False
        t0 = time.perf_counter()
        try:
            if ready:
                self.h.add_sample(*ready)
            else:
                self.h.add_rollout(*item, self._model, self._version)
            self.captured += 1
        except Exception as exc:
            # one bad rollout (e.g. longer than the policy's context) must not stop RL
            if not self.errors:
                print(f"warning: harvest skipped a rollout: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.errors += 1
        self.capture_s += time.perf_counter() - t0
        return True

    def idle_window(self) -> IdleWindow:
        window = self.h.idle_window(extra=self._capture_one, cores=self._cores)
        self._windows.append(window)
        return window

    def step_metrics(self) -> dict:
        """This step's harvest figures for the trainer's metrics row (call after the rollouts)."""
        reports = [w.report for w in self._windows]
        captured0, steps0, version0, attempts0, dropped0, update0 = self._start
        serving = self.h.score(self.h.serving)
        attempts = self.h.history[attempts0:]
        used, capture_s = sum(r.busy_s for r in reports), self.capture_s - self._capture_s0
        return {
            "idle_window_s": sum(r.window_s for r in reports),
            "idle_used_s": used,
            "idle_free_core_s": sum(r.free_s for r in reports) if self._cores else None,
            "idle_capture_s": capture_s,
            "idle_train_s": max(used - capture_s, 0.0),
            "idle_overrun_s": max((r.overrun_s for r in reports), default=0.0),
            "drafter_steps": self.h.steps - steps0,
            "harvested": self.captured - captured0,
            "update_captured": self.update_captured - update0,
            # carried: queued for the idle window; pending: captured by the update, spooled next window
            "harvest_carried": len(self._queue),
            "harvest_pending": len(self._ready),
            "harvest_dropped": self.dropped - dropped0,
            "harvest_errors": self.errors,
            "drafter_version": self.h.version,
            "drafter_pushes": self.h.version - version0,
            "drafter_push_attempts": len(attempts),
            "candidate_accept_len": attempts[-1].get("candidate") if attempts else None,
            "push_why": self.h.push_status(attempts[-1] if attempts else None),
            # each push's measured paired gain (tokens per verify pass) and its lower bound
            "push_gains": [(round(a["gain"], 4), round(a["gain_lower"], 4)) for a in attempts if a.get("pushed")],
            "heldout_accept_len": serving,
            "spool_tokens": self.h.spool.mem_tokens,
            "sd_token_share": self._tokens[1] / max(self._tokens[0], 1),
        }
