"""gleanrl: faster RL training of reasoning LLMs: an EAGLE-3 drafter trained in each step's long tail is
hot-swapped into the rollout server (lossless speculative decoding). The public API is imported lazily,
so `import gleanrl.clients` does not load torch:

    from gleanrl import Harvester, RolloutClient, Rollout, load_task, train
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_MODULES = {  # module -> the public names it defines
    "gleanrl.harvest.harvester": "Harvester",
    "gleanrl.harvest.config": "HarvestConfig",
    "gleanrl.harvest.hooks": "HarvestHooks",
    "gleanrl.clients.rollout_client": "RolloutClient",
    "gleanrl.clients.transport": "RolloutServerError",
    "gleanrl.clients.rollout": "Rollout RolloutStatus",
    "gleanrl.clients.weight_sync": "DrafterPush",
    "gleanrl.trainer.tasks": "load_task",
    "gleanrl.trainer.tasks.base": "Task",
    "gleanrl.trainer.loop": "train",
    "gleanrl.trainer.hooks": "RolloutHooks NoHooks",
    "gleanrl.trainer.config": "TrainConfig",
}
_API = {name: module for module, names in _MODULES.items() for name in names.split()}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'gleanrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
