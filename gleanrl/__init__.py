"""gleanrl: faster RL training of reasoning LLMs. An EAGLE-3 drafter is trained in the long tail of
each step on harvested hidden states and hot-swapped into the rollout server, so rollouts decode
faster with lossless speculative decoding; the same server then serves the final policy and drafter.

The public API is imported lazily, so `import gleanrl.clients` does not load torch:

    from gleanrl import Harvester, RolloutClient, Rollout, load_task, train
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "Harvester": "gleanrl.harvest.harvester",
    "HarvestConfig": "gleanrl.harvest.config",
    "HarvestHooks": "gleanrl.harvest.hooks",
    "RolloutClient": "gleanrl.clients.rollout_client",
    "RolloutServerError": "gleanrl.clients.transport",
    "Rollout": "gleanrl.clients.rollout",
    "RolloutStatus": "gleanrl.clients.rollout",
    "DrafterPush": "gleanrl.clients.weight_sync",
    "load_task": "gleanrl.trainer.tasks",
    "Task": "gleanrl.trainer.tasks.base",
    "train": "gleanrl.trainer.loop",
    "RolloutHooks": "gleanrl.trainer.hooks",
    "NoHooks": "gleanrl.trainer.hooks",
    "TrainConfig": "gleanrl.trainer.config",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'gleanrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
