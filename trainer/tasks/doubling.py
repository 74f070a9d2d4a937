"""The default built-in task: double a number k times, keeping the last three digits (2^k * x mod 1000).

    prompt (user turn):  double 4 times, keep 3 digits: 347
    solution:            347
                         04:694
                         03:388
                         02:776
                         01:552
                         \\boxed{552}

Each `remaining:value` line is a local rule (decrement; digit j of the double is 2*d_j mod 10 plus a carry when d_(j+1)
>= 5) a small model learns by SFT in minutes. k follows a truncated power law (P(k) ~ (k+1)^-alpha, 0 <= k <= max_steps;
0 is a copy): mostly short, a few very long, like chains of thought, and longer is harder. `tail_share` > 0 (long-tail
presets) draws that share of each batch from k in [tail_min, max_steps] (count stochastically rounded: a batch of 8 at
1/8 holds one on average). Reward: the last \\boxed{} equals the result (leading zeros allowed).

Self-checks (`checks` > 0, task `doubling_checks`): after each derivation the solution may derive again after a `check`
line, with probability `checks` (geometric, at most `max_checks` and `max_chars`), then box the result (lines `347`,
`01:694`, `check`, `347`, `01:694`, `\\boxed{694}`). The policy learns the choice (T = 1 checks as often as its data;
greedy never for `checks` < 0.5), the reward ignores it: lengths vary within a group, multiplicatively and heavy-tailed,
as chains of thought do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gleanrl.trainer.tasks.base import Task
from gleanrl.trainer.tasks.chartok import chatml
from gleanrl.trainer.tasks.math_answer import answers_match, last_boxed


@dataclass(frozen=True)
class Doubling(Task):
    max_steps: int = 99
    alpha: float = 1.3  # power-law exponent of k + 1; larger = shorter problems
    tail_share: float = 0.0  # share of each batch of problems drawn from the tail
    tail_min: int = 80  # the tail: tail_min <= k <= max_steps
    checks: float = 0.0  # probability of one more self-check after each derivation
    max_checks: int = 6
    max_chars: int = 1400  # a solution with its checks stays within this (the SFT context)
    name: str = "doubling"

    def __post_init__(self) -> None:
        if not 0 <= self.max_steps <= 99:
            raise ValueError(f"max_steps must be in [0, 99], got {self.max_steps}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if not 0 <= self.tail_share <= 1:
            raise ValueError(f"tail_share must be in [0, 1], got {self.tail_share}")
        if self.tail_share > 0 and not 0 <= self.tail_min <= self.max_steps:
            raise ValueError(f"tail_min must be in [0, max_steps={self.max_steps}], got {self.tail_min}")
        if not 0 <= self.checks < 1 or self.max_checks < 0:
            raise ValueError(f"checks must be in [0, 1) and max_checks >= 0, got {self.checks}, {self.max_checks}")

    def sample(self, rng: random.Random, tail: bool = False) -> dict:
        ks = range(self.max_steps + 1)
        if tail:
            k = rng.randint(self.tail_min, self.max_steps)
        else:
            k = rng.choices(ks, weights=[(i + 1) ** -self.alpha for i in ks])[0]
        start = rng.randint(0, 999)
        question = f"double {k} times, keep 3 digits: {start:03d}"
        sample = {
            "prompt": chatml(question),
            "messages": [{"role": "user", "content": question}],
            "start": start,
            "steps": k,
            "answer": str(start * 2**k % 1000),
        }  # the start last in the question: a fixed-offset copy
        if self.checks > 0:  # the SFT data's number of self-checks; no draw otherwise (problems stay as they were)
            fits = (self.max_chars - 12) // (len(self._derivation(start, k)) + 6) - 1
            n = 0
            while n < min(self.max_checks, fits) and rng.random() < self.checks:
                n += 1
            sample["checks"] = n
        return sample

    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        """`n` problems, the same for the same (split, seed); splits draw from independent streams."""
        rng = random.Random(f"{self.name}/{split}/{seed}")
        tail: set[int] = set()
        if self.tail_share > 0:  # no draw otherwise: the default task's problems stay what they were
            whole, frac = divmod(n * self.tail_share, 1)
            tail = set(rng.sample(range(n), min(n, int(whole) + (rng.random() < frac))))
        return [self.sample(rng, i in tail) for i in range(n)]

    @staticmethod
    def _derivation(start: int, k: int) -> str:
        value, lines = start, [f"{start:03d}"]
        for remaining in range(k, 0, -1):
            value = value * 2 % 1000
            lines.append(f"{remaining:02d}:{value:03d}")
        return "\n".join(lines) + "\n"

    def solution(self, sample: dict) -> str:
        """The reference response (without the end-of-turn token)."""
        derivation = self._derivation(sample["start"], sample["steps"])
        value = sample["start"] * 2 ** sample["steps"] % 1000
        checks = "".join("check\n" + derivation for _ in range(sample.get("checks", 0)))
        return derivation + checks + f"\\boxed{{{value:03d}}}"

    def solution_choices(self, sample: dict) -> list[tuple[int, int]]:
        """After each derivation: check again or box (the first character of either)."""
        step = len(self._derivation(sample["start"], sample["steps"]))
        return [(step + i * (step + 6), step + i * (step + 6) + 1) for i in range(sample.get("checks", 0) + 1)]

    def solution_focus(self, sample: dict) -> list[tuple[int, int]]:
        """The characters carrying the hard step (for `trainer.tasks.sft`): the first line's counter, k copied
        from the prompt (k = 0: the choice to box at once); the rest is a local rule at a fixed offset."""
        return [(4, 6)] if sample["steps"] else [(4, 5)]

    def reward(self, sample: dict, response: str) -> float:
        return 1.0 if answers_match(last_boxed(response), sample["answer"]) else 0.0
