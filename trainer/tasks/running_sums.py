"""The built-in task: running sums of a labelled list of digits, every partial sum written out.

    prompt (user turn):  sum: a3 b5 c2 d8
    solution:            a3=3 b5=8 c2=10 d8=18
                         \\boxed{18}

The list length is drawn from a truncated power law (P(n) ~ n^-alpha, 1 <= n <= max_items): mostly short, a few
very long, like chains of thought. Each step needs a lookup (the next label's digit) and a carry, so longer is
harder. The reward is exact: the last \\boxed{} must equal the total.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from gleanrl.trainer.tasks.base import Task
from gleanrl.trainer.tasks.chartok import chatml
from gleanrl.trainer.tasks.math_answer import answers_match, last_boxed

LABELS = string.ascii_lowercase + string.ascii_uppercase


@dataclass(frozen=True)
class RunningSums(Task):
    max_items: int = 52
    alpha: float = 1.4  # power-law exponent of the list length; larger = shorter lists
    name: str = "running_sums"

    def __post_init__(self) -> None:
        if not 1 <= self.max_items <= len(LABELS):
            raise ValueError(f"max_items must be in [1, {len(LABELS)}], got {self.max_items}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")

    def sample(self, rng: random.Random) -> dict:
        lengths = range(1, self.max_items + 1)
        n = rng.choices(lengths, weights=[k**-self.alpha for k in lengths])[0]
        items = [rng.randint(1, 9) for _ in range(n)]
        question = "sum: " + " ".join(f"{LABELS[i]}{d}" for i, d in enumerate(items))
        return {
            "prompt": chatml(question),
            "messages": [{"role": "user", "content": question}],
            "items": items,
            "answer": str(sum(items)),
        }

    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        """`n` problems, the same for the same (split, seed); splits draw from independent streams."""
        rng = random.Random(f"{self.name}/{split}/{seed}")
        return [self.sample(rng) for _ in range(n)]

    def solution(self, sample: dict) -> str:
        """The reference response (without the end-of-turn token): every partial sum, then the total."""
        steps, total = [], 0
        for i, d in enumerate(sample["items"]):
            total += d
            steps.append(f"{LABELS[i]}{d}={total}")
        return " ".join(steps) + f"\n\\boxed{{{total}}}"

    def reward(self, sample: dict, response: str) -> float:
        return 1.0 if answers_match(last_boxed(response), sample["answer"]) else 0.0
