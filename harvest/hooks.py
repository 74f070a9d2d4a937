"""The Harvester behind gleanrl's trainer hooks (`trainer.generate.RolloutHooks`, duck-typed: nothing
in `harvest` imports `trainer`).

- `on_step_start(step, model)`: the trainer's current policy captures this step's rollouts.
- `on_rollout_finished(rollout)`: runs in the trainer's event loop, so it only enqueues.
- `idle_window()`: a background thread that, while rollouts are in flight, first captures queued
  rollouts into the spool, then trains the drafter, one micro-step at a time, pushing a better drafter
  every `push_every` steps. Leaving the window stops it within one micro-step.

Rollouts still queued when the window closes (the tail: the last ones finish just before the policy
update) are carried over and captured first in the next window, by the new policy, and recorded with
its version: hidden states and soft labels then come from the policy the drafter must serve next, only
the tokens were sampled one version earlier, as EAGLE's own training data is never on-policy. The
queue is bounded (`max_queue`, oldest dropped and counted).

Resume: `state_dict()` (the Harvester's, plus the queue) is saved with every trainer checkpoint; after
`load_state_dict()` the serving drafter version is pushed again to the trainer's servers (`bind_push`),
so a server that never got it (a crash between writing it and pushing it) serves what the run resumes with.

Cores on one CPU machine: give the server and the trainer their own cores, as a GPU cluster gives them
their own devices, so that drafter training really uses idle trainer compute, e.g. on 2 cores
`taskset -c 0 gleanrl serve --threads 1 ...` and `taskset -c 1 gleanrl train --trainer-threads 1 ...`
(`gleanrl demo` and `bench e2e` do this with CPU affinity).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gleanrl.harvest.atomic import atomic_file
from gleanrl.harvest.harvester import HarvestConfig, Harvester
from gleanrl.harvest.idle import IdleWindow
from gleanrl.harvest.spool import SpoolConfig

CONFIG_FILE = "harvest_config.json"  # in the run's harvest root, next to spool/ and drafter_versions/


class HarvestHooks:
    def __init__(self, harvester: Harvester, max_queue: int = 512):
        self.h, self.max_queue = harvester, max_queue
        self._queue: collections.deque = collections.deque()
        self._model: Any = None
        self._version = 0
        self._windows: list[IdleWindow] = []
        self._tokens = [0, 0]
        self._start = (0, 0, harvester.version, 0, 0)  # captured, drafter steps, version, attempts, dropped
        self.captured = self.dropped = self.errors = 0
        self.capture_s = 0.0  # idle time spent capturing (the rest of the used idle time trains the drafter)
        self._capture_s0 = 0.0
        self._repush = False

    @classmethod
    def for_run(cls, model: str, drafter: str, root: Path, resume: bool) -> tuple[HarvestHooks, Path]:
        """Hooks over `root` (spool, drafter versions: kept by a resumed run) and the drafter to serve:
        the newest pushed version, else `drafter`. Drafters go to the loop's servers (`bind_push`).
        Settings: `root/harvest_config.json` (`write_config`; `gleanrl train` writes it from its flags)."""
        if not resume and any((root / "drafter_versions").glob("v*")):
            raise ValueError(f"{root} holds drafter versions of an earlier run: pass --resume, or use another --out")
        h = Harvester(model, drafter, root / "spool", cfg=read_config(root))
        return cls(h), (h.versions_dir / f"v{h.version:06d}" if h.version else Path(drafter))

    def bind_push(self, push: Callable[[str, int], None]) -> None:
        """Push drafters with the trainer's `push(path, version)` (to its servers) unless the Harvester
        already has one; after a resume, push the serving version again."""
        if self.h.push is None:
            self.h.push = push
        path = self.h.versions_dir / f"v{self.h.version:06d}"
        if self._repush and self.h.version and path.is_dir():
            try:
                self.h.push_checkpoint(str(path), self.h.version)
            except Exception as exc:  # whatever the push raises: the next push replaces it; RL must not stop
                print(f"warning: re-pushing drafter v{self.h.version} after resume failed: {exc}", file=sys.stderr)
        self._repush = False

    def state_dict(self) -> dict:
        return {"harvester": self.h.state_dict(), "queue": [list(map(list, q)) for q in self._queue],
                "counts": (self.captured, self.dropped, self.errors)}

    def load_state_dict(self, state: dict) -> None:
        self.h.load_state_dict(state["harvester"])
        self._queue = collections.deque(tuple(q) for q in state["queue"])
        self.captured, self.dropped, self.errors = state["counts"]
        self._repush = True

    def on_step_start(self, step: int, model: Any) -> None:
        self._model, self._version = model, step - 1  # the policy that samples step N is version N-1
        self._windows = []
        self._tokens = [0, 0]  # this step's output tokens: all, from SD
        self._start = (self.captured, self.h.steps, self.h.version, len(self.h.history), self.dropped)
        self._capture_s0 = self.capture_s

    def on_rollout_finished(self, rollout: Any) -> None:
        self._queue.append((list(rollout.prompt_ids), list(rollout.output_ids)))
        if len(self._queue) > self.max_queue:
            self._queue.popleft()
            self.dropped += 1
        n = len(rollout.output_ids)  # tokens that came out of SD verify passes (each yields accept_length)
        self._tokens[0] += n
        self._tokens[1] += min(n, round(rollout.spec_verify_ct * rollout.spec_accept_length))

    def _capture_one(self) -> bool:
        try:
            prompt_ids, output_ids = self._queue.popleft()
        except IndexError:
            return False
        t0 = time.perf_counter()
        try:
            self.h.add_rollout(prompt_ids, output_ids, self._model, self._version)
            self.captured += 1
        except Exception as exc:  # one bad rollout (e.g. longer than the policy's context) must not stop RL
            if not self.errors:
                print(f"warning: harvest skipped a rollout: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.errors += 1
        self.capture_s += time.perf_counter() - t0
        return True

    def idle_window(self) -> IdleWindow:
        window = self.h.idle_window(extra=self._capture_one)
        self._windows.append(window)
        return window

    def step_metrics(self) -> dict:
        """This step's harvest figures for the trainer's metrics row (call after the rollouts)."""
        reports = [w.report for w in self._windows]
        captured0, steps0, version0, attempts0, dropped0 = self._start
        serving = self.h.score(self.h.serving)
        attempts = self.h.history[attempts0:]
        used, capture_s = sum(r.busy_s for r in reports), self.capture_s - self._capture_s0
        return {"idle_window_s": sum(r.window_s for r in reports), "idle_used_s": used,
                "idle_capture_s": capture_s, "idle_train_s": max(used - capture_s, 0.0),
                "idle_overrun_s": max((r.overrun_s for r in reports), default=0.0),
                "drafter_steps": self.h.steps - steps0, "harvested": self.captured - captured0,
                "harvest_carried": len(self._queue), "harvest_dropped": self.dropped - dropped0,
                "harvest_errors": self.errors, "drafter_version": self.h.version,
                "drafter_pushes": self.h.version - version0, "drafter_push_attempts": len(attempts),
                "candidate_accept_len": attempts[-1].get("candidate") if attempts else None,
                "heldout_accept_len": serving,
                "spool_tokens": self.h.spool.mem_tokens, "sd_token_share": self._tokens[1] / max(self._tokens[0], 1)}


def write_config(root: Path, cfg: HarvestConfig) -> Path:
    """Store a run's harvest settings where `for_run` (and so `--resume`) reads them."""
    root.mkdir(parents=True, exist_ok=True)
    with atomic_file(root / CONFIG_FILE, "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=2)
    return root / CONFIG_FILE


def read_config(root: Path) -> HarvestConfig:
    """The settings `write_config` stored under `root`; the defaults if none were."""
    path = root / CONFIG_FILE
    if not path.is_file():
        return HarvestConfig()
    try:
        values = json.loads(path.read_text())
        return HarvestConfig(**values | {"spool": SpoolConfig(**values.get("spool", {}))})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not valid harvest settings ({exc})") from None
