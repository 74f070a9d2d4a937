"""Tasks from JSONL files of `{"prompt": ..., "answer": ...}` records (GSM8K/MATH-style), scored with the
math-answer reward: the last `\\boxed{...}` in the response (else the last number), normalised, against the reference
answer; numbers and simple fractions compare by value. `prompt` goes to `/generate` verbatim (apply your model's chat
template). A bad line is reported with its line number and skipped.
"""

from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gleanrl.trainer.tasks.base import Task

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if absent or unclosed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(response: str) -> str | None:
    """The final answer a response states: the last \\boxed{} content, else its last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


def normalize(answer: str) -> str:
    """Canonical text: no spaces, $, \\left/\\right, \\text{}, trailing period or thousands separators."""
    s = answer.strip()
    if "####" in s:  # GSM8K reference solutions end with "#### 72"
        s = s.rsplit("####", 1)[1]
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    for junk in ("$", "\\left", "\\right", "\\!", "\\,", "\\%", "%", " "):
        s = s.replace(junk, "")
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def to_number(s: str) -> float | None:
    """Value of an integer, decimal, a/b or \\frac{a}{b}; None for anything else."""
    m = _FRAC.match(s)
    if m:
        s = f"{m.group(1)}{m.group(2)}/{m.group(3)}"
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return float(num) / float(den)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, reference: str) -> bool:
    if predicted is None:
        return False
    p, r = normalize(predicted), normalize(str(reference))
    if not p:
        return False
    pv, rv = to_number(p), to_number(r)
    if pv is not None and rv is not None:
        return abs(pv - rv) <= 1e-6 * max(1.0, abs(rv))
    return p == r


def math_reward(response: str, reference: str) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0."""
    return 1.0 if answers_match(extract_answer(response), reference) else 0.0


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
