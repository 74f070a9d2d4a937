"""Named regimes for the built-in task (`--regime` of `gleanrl demo` and `bench e2e`): length distribution, step shape.

- `long_tail` (default of `bench e2e`): one prompt in 8 on average is 80-99 doublings (560-700 tokens), the rest the
  power law: a few rollouts decode alone for the rest of the phase. Aim: rollouts taking most of a no-SD step, as in
  reasoning RL (TLT ~85 %, FastGRPO 91-98 %), nothing slowed to get there.
- `reasoning_tail`: a few single responses far past the rest (TLT's premise), so 1-2 sequences decode for most of the
  tail, where SD pays on this CPU (ridge ~15 rows a forward). One prompt in 32 is 80-99 doublings; 32 x 2 samples.
- `self_checks` (the `deep` policy's default): heavy-tailed lengths per sample: the longest of 64 runs alone through
  a share of the rollouts (simulated: ~30 % of decode iterations at 16 x 4 with <= 2 running, ~25 % at 8 x 8).
- `short` (default of `gleanrl demo`): power law alone, 512-token cap, rollouts ~52 % of a no-SD step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Regime:
    task: str  # a built-in task name (trainer.tasks.BUILTIN)
    max_new_tokens: int
    prompts_per_step: int
    samples_per_prompt: int

    def __post_init__(self) -> None:
        if min(self.max_new_tokens, self.prompts_per_step, self.samples_per_prompt) < 1:
            raise ValueError("max_new_tokens, prompts_per_step and samples_per_prompt must be >= 1")


REGIMES = {
    "long_tail": Regime(task="doubling_long_tail", max_new_tokens=768, prompts_per_step=8, samples_per_prompt=8),
    "reasoning_tail": Regime(
        task="doubling_reasoning_tail", max_new_tokens=768, prompts_per_step=32, samples_per_prompt=2
    ),
    "self_checks": Regime(task="doubling_checks", max_new_tokens=1400, prompts_per_step=16, samples_per_prompt=4),
    "short": Regime(task="doubling", max_new_tokens=512, prompts_per_step=8, samples_per_prompt=8),
}
DEMO_REGIME = "short"


def regime(name: str) -> Regime:
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}: choose one of {sorted(REGIMES)}")
    return REGIMES[name]
