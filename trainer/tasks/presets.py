"""Named regimes for the built-in task: its length distribution and the step's shape (what
`gleanrl demo` and `gleanrl bench e2e` run with `--regime`).

- `long_tail` (the default of `gleanrl bench e2e`): one prompt in eight (on average) is a
  80-99-doubling problem, a 560-700 token response, the rest follow the usual power law. Most of a
  step's rollouts finish early, a few decode one token at a time for the rest of the rollout phase,
  while the policy update's cost grows with the step's total tokens (and a long group whose samples
  all fail has no advantage and is left out): the aim is rollouts taking most of a no-SD step, as in
  reasoning RL (TLT reports ~85 %, FastGRPO 91-98 %), with nothing slowed down to get there. Not yet
  measured on the demo policy. The format is the default task's (k <= 99, which the default
  bootstrap is trained on), so the default bootstrap policy answers it without a new bootstrap.
- `reasoning_tail`: the tail of reasoning RL, where a few single responses run far past the rest
  (TLT's premise), so that for most of the tail 1-2 sequences decode: the regime where SD pays on
  this CPU (its ridge is ~15 rows a forward; 1-2 running here behave like a GPU's tens). One prompt
  in 32 (on average) is an 80-99-doubling problem, and groups are pairs: the built-in task's
  response length is set by its prompt, so siblings run in lockstep, and per-sample variation
  within a group is modelled by small groups. 32 prompts x 2 samples.
- `self_checks` (the default of the `deep` policy, `gleanrl.shipped`): the `doubling_checks` task,
  whose responses check themselves a sampled number of times (geometric, `trainer.tasks.doubling`),
  so lengths vary per sample within each group, heavy-tailed: the longest of a step's 64 runs alone
  through a share of its rollouts (in a simulation of the SFT data's lengths ~30 % of the decode
  iterations at 16 x 4 with <= 2 running, ~25 % at 8 x 8), as reasoning chains do.
- `short` (the default of `gleanrl demo`, whose wall time is measured in this regime; long_tail is
  opt-in there until its demo time is measured): power law alone, 512-token cap, where rollouts were
  ~52 % of a no-SD step.
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
