"""The seam between the RL loop and the harvester: every hook the loop calls, in one typed protocol.

`harvest.hooks.HarvestHooks` implements it (structurally: nothing in `harvest` imports `trainer`);
`NoHooks` implements every hook as a no-op, so hooks that need only a few subclass it. The loop
calls each hook unconditionally (no `hasattr`); `train()` refuses an object that lacks one.

In the order the loop calls them:
- `harvests`: True when the hooks train a drafter beside the rollouts (on CPU the embedded servers are
  then one replica per core and the drafter trains on the cores of those that finished:
  trainer.layout), and the metrics table shows the harvest columns.
- `load_state_dict(state)`: on resume, the `state_dict()` saved with the checkpoint resumed from.
- `bind_push(push)`: once the servers serve the loop's weights; `push(path, version)` sends a
  drafter to the loop's servers.
- `bind_cores(cores)`: once, where the loop runs its own replicas pinned to their cores: `cores()`
  names the cores whose replica has nothing left to run while another still does (None: no layout).
- `scheduling_probe()`: with `harvests`, once at the start: a context in which the harvester's kind
  of compute runs at its priority, so the loop can time the server with and without it
  (`trainer.sched_check`).
- `on_step_start(step, model)`: before the step's rollouts; `model` is the policy that samples them.
- `idle_window()`: entered while rollouts are in flight, left before the policy update.
- `on_rollout_finished(rollout)`: in the event loop as each rollout finishes (keep it short).
- `update_capture()`: around the policy update; yields what `Policy.train_step(capture=...)` takes
  (`harvest.capture.UpdateCapture`, or None: nothing captured).
- `state_dict()`: saved with every step checkpoint (None: nothing to save).
- `step_metrics()`: merged into the step's metrics row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import Protocol, runtime_checkable

import torch

from gleanrl.clients.rollout import Rollout


@runtime_checkable
class RolloutHooks(Protocol):
    harvests: bool

    def load_state_dict(self, state: dict) -> None: ...
    def bind_push(self, push: Callable[[str, int], None]) -> None: ...
    def bind_cores(self, cores: Callable[[], Collection[int] | None] | None) -> None: ...
    def scheduling_probe(self) -> contextlib.AbstractContextManager: ...
    def on_step_start(self, step: int, model: torch.nn.Module) -> None: ...
    def idle_window(self) -> contextlib.AbstractContextManager: ...
    def on_rollout_finished(self, rollout: Rollout) -> None: ...
    def update_capture(self) -> contextlib.AbstractContextManager: ...
    def state_dict(self) -> dict | None: ...
    def step_metrics(self) -> dict: ...


class NoHooks:
    """Every hook, doing nothing: the loop without a harvester, and a base for hooks needing few."""

    harvests = False

    def load_state_dict(self, state: dict) -> None:
        pass

    def bind_push(self, push: Callable[[str, int], None]) -> None:
        pass

    def bind_cores(self, cores: Callable[[], Collection[int] | None] | None) -> None:
        pass

    def scheduling_probe(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def on_step_start(self, step: int, model: torch.nn.Module) -> None:
        pass

    def idle_window(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def on_rollout_finished(self, rollout: Rollout) -> None:
        pass

    def update_capture(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def state_dict(self) -> dict | None:
        return None

    def step_metrics(self) -> dict:
        return {}


def missing_hooks(candidate: object) -> list[str]:
    """The protocol's members that `candidate` lacks (empty: it implements every hook). `train()`
    checks once, at its start; the loop then calls every hook unconditionally."""
    return [n for n in HOOKS if not hasattr(candidate, n)]


# the protocol's members, in the order the loop calls them
HOOKS = tuple(n for n in vars(NoHooks) if not n.startswith("_"))
