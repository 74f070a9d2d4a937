"""The Task plug-in's base class: what the RL loop, the bootstrap and the evals call."""

from __future__ import annotations


class Task:
    """The plug-in the RL loop trains on (`trainer.tasks.load_task`): define `prompts` (records holding "prompt",
    the text sent to /generate, and what `reward` needs) and `reward` (1.0 = correct); the rest have defaults."""

    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        raise NotImplementedError

    def reward(self, sample: dict, response: str) -> float:
        raise NotImplementedError

    def correct(self, sample: dict, response: str, reward: float) -> bool:
        return reward >= 1.0  # what the eval metrics count as correct

    def solution(self, sample: dict) -> str | None:
        return None  # the reference solution (bootstrap's SFT, `gleanrl measure`); None: none

    def solution_focus(self, sample: dict) -> list[tuple[int, int]]:
        return []  # character spans of `solution(sample)` that SFT weighs by `focus_weight`

    def solution_choices(self, sample: dict) -> list[tuple[int, int]]:
        return []  # spans of `solution(sample)` that are free choices the reward ignores: not scored
