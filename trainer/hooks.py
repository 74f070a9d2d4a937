"""The seam between the RL loop and the harvester: every hook the loop calls, in one typed protocol.

`harvest.hooks.HarvestHooks` implements it structurally (`harvest` never imports `trainer`); the protocol's own
bodies do nothing, so `NoHooks` (it, subclassed) is the loop without a harvester and a base for hooks needing few.
The loop calls each unconditionally; `train()` refuses an object lacking one. In call order:
- `harvests`: a drafter trains beside the rollouts (on CPU: one replica per core, trainer.layout; harvest columns).
- `load_state_dict(state)` on resume; `bind_push(push)` once the servers serve the loop's weights.
- `bind_cores(cores)` once, with pinned replicas: `cores()` names those of replicas done while another runs.
- `scheduling_probe()` once with `harvests`: the harvester's compute at its priority (`trainer.run.check_scheduling`).
- `on_step_start(step, model)`, `model` sampling the step; `idle_window()` while rollouts are in flight.
- `on_rollout_finished(rollout)` in the event loop (keep it short).
- `update_capture()` around the update: what `Policy.train_step(capture=...)` takes, or None.
- `state_dict()` with every checkpoint (None: nothing); `step_metrics()`, merged into the row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import Protocol, runtime_checkable

import torch

from gleanrl.clients.rollout import Rollout


@runtime_checkable
class RolloutHooks(Protocol):
    harvests: bool = False

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


class NoHooks(RolloutHooks):
    """Every hook, doing nothing: the loop without a harvester, and a base for hooks needing few."""


# the protocol's members, in the order the loop calls them
HOOKS = tuple(n for n in vars(RolloutHooks) if not n.startswith("_"))


def missing_hooks(candidate: object) -> list[str]:
    """The protocol's members that `candidate` lacks (empty: it implements every hook)."""
    return [n for n in HOOKS if not hasattr(candidate, n)]
