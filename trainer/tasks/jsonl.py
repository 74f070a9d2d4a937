"""Tasks from JSONL files of `{"prompt": ..., "answer": ...}` records (GSM8K/MATH-style), scored with the
math-answer reward. `prompt` goes to `/generate` verbatim (apply your model's chat template). A bad line is
reported with its line number and skipped.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gleanrl.trainer.tasks.base import Task
from gleanrl.trainer.tasks.math_answer import math_reward


class TaskError(ValueError):
    """A task spec or task file the user must fix."""


def read_records(path: str | Path) -> tuple[list[dict], list[str]]:
    """(good records, one message per bad line naming `path:line`)."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    records, errors = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                errors.append(f"{path}:{lineno}: not valid JSON ({exc.msg})")
                continue
            if not isinstance(rec, dict):
                errors.append(f"{path}:{lineno}: expected an object, got {type(rec).__name__}")
            elif not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
                errors.append(f"{path}:{lineno}: missing or empty string field 'prompt'")
            elif not isinstance(rec.get("answer"), (str, int, float)) or isinstance(rec.get("answer"), bool):
                errors.append(f"{path}:{lineno}: missing field 'answer' (a string or a number)")
            else:
                records.append({**rec, "answer": str(rec["answer"]), "line": lineno})
    return records, errors


@dataclass
class JsonlTask(Task):
    """`splits` maps a split name to its file; a split without one uses the "train" file."""

    splits: dict[str, str]
    name: str = "jsonl"
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if "train" not in self.splits:
            raise TaskError("a JSONL task needs a 'train' file")

    def records(self, split: str) -> list[dict]:
        path = self.splits.get(split, self.splits["train"])
        if path not in self._cache:
            records, errors = read_records(path)
            for message in errors:
                print(f"skipping {message}", file=sys.stderr)
            if not records:
                raise TaskError(f"{path} has no usable records ({len(errors)} bad lines)")
            self._cache[path] = records
        return self._cache[path]

    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        """`n` records in a seeded order; cycles through the file when `n` exceeds it."""
        records = list(self.records(split))
        rng = random.Random(f"{self.name}/{split}/{seed}")
        out: list[dict] = []
        while len(out) < n:
            rng.shuffle(records)
            out.extend(records[: n - len(out)])
        return out

    def reward(self, sample: dict, response: str) -> float:
        return math_reward(response, sample["answer"])


def parse_jsonl_spec(spec: str) -> JsonlTask:
    """`jsonl:PATH` (one file for every split) or `jsonl:train=PATH,test=PATH`; a bare `*.jsonl` path too."""
    body = spec.removeprefix("jsonl:")
    if "=" not in body:
        return JsonlTask({"train": body})
    splits = {}
    for part in body.split(","):
        split, sep, path = part.partition("=")
        if not sep or not split or not path:
            raise TaskError(f"bad JSONL task spec {spec!r}: expected jsonl:train=PATH[,test=PATH]")
        splits[split.strip()] = path.strip()
    return JsonlTask(splits)
