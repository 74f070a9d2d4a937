"""Tasks and rewards: the plug-in interface the RL loop trains on (`base.Task`, here as `Task`).

`load_task(spec)`: the default built-in for None, a built-in by name, a JSONL dataset (`jsonl:PATH`,
`jsonl:train=PATH,test=PATH`, `*.jsonl`), or a user task by dotted path (`my_pkg.my_module:my_task`; a class or
factory there is called without arguments).
"""

from __future__ import annotations

import functools
import importlib

from gleanrl.trainer.tasks.base import Task
from gleanrl.trainer.tasks.builtin import Doubling, RunningSums
from gleanrl.trainer.tasks.jsonl import JsonlTask, TaskError

DEFAULT_TASK = "doubling"
BUILTIN = {  # the long tail: trainer.tasks.presets
    "doubling": Doubling,
    "running_sums": RunningSums,
    "doubling_long_tail": functools.partial(Doubling, tail_share=0.125, tail_min=80, name="doubling_long_tail"),
    "doubling_reasoning_tail": functools.partial(
        Doubling, tail_share=1 / 32, tail_min=80, name="doubling_reasoning_tail"
    ),
    # per-sample self-checks: a heavy tail within each group (the deep policy's task)
    "doubling_checks": functools.partial(Doubling, checks=0.4, name="doubling_checks"),
}

__all__ = ["Task", "TaskError", "load_task", "accuracy", "JsonlTask", "Doubling", "RunningSums", "DEFAULT_TASK"]


def load_task(spec: str | Task | None = None) -> Task:
    if spec is None:
        spec = DEFAULT_TASK
    if not isinstance(spec, str):
        return _checked(spec, repr(spec))
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if spec.startswith("jsonl:") or spec.endswith(".jsonl"):
        from gleanrl.trainer.tasks.jsonl import parse_jsonl_spec

        return parse_jsonl_spec(spec)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TaskError(f"unknown task {spec!r}: use one of {sorted(BUILTIN)}, jsonl:PATH or module:object")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TaskError(f"cannot import task module {module_name!r}: {exc}") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise TaskError(f"module {module_name!r} has no attribute {attr!r}")
    if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Task)):
        obj = obj()
    return _checked(obj, spec)


def _checked(task, spec: str) -> Task:
    if not isinstance(task, Task):
        how = "subclass gleanrl.trainer.tasks.base.Task (prompts(split, n, seed) and reward(sample, response))"
        raise TaskError(f"{spec} is not a task: {how}")
    return task


def accuracy(task: Task, samples: list[dict], responses: list[str]) -> float:
    """Mean reward >= 1 over the samples (the share answered correctly)."""
    if len(samples) != len(responses):
        raise ValueError(f"{len(samples)} samples but {len(responses)} responses")
    return sum(task.reward(s, r) >= 1.0 for s, r in zip(samples, responses)) / max(1, len(samples))
