"""Which draft source(s) and how far: the SD bandit's arms extended to group drafts and the fused tree.

An arm is (source, k): ("plain", 0); ("eagle", k), the EAGLE-3 chain of k tokens; ("group", k), the
group draft of up to k tokens; ("fused", k), both as two branches of one tree, the EAGLE-3 chain of k
tokens and the group draft of up to `group_len` tokens (free, so not shortened with k). The same
epsilon-greedy bandit per running-batch bucket (`SDPolicy`: tokens per second of the decode iteration,
sliding windows, knowledge decayed but kept across drafter swaps) chooses among the arms available:
each arm is tried once per bucket (the prior first: the richest source at the table's length), then
the best measured one is played. EAGLE-3 arms are available while running <= max_batch (each draft
token costs a drafter forward), group ones while running <= group_max_batch (drafts cost no model
forward, so SD may pay at larger batches: plain decoding competes in every bucket and the bandit
measures where it stops paying). EAGLE-3 arms keep SDPolicy's integer keys, so its measurements and
the table prior are shared with the EAGLE-only path.
"""
from __future__ import annotations

from dataclasses import dataclass

from gleanrl.server.sd.policy import SDPolicy, SDPolicyConfig

Arm = tuple[str, int]
SOURCES = ("eagle", "group", "fused")


@dataclass(frozen=True, slots=True)
class GroupSDConfig:
    sources: tuple[str, ...] = SOURCES          # the arms' sources the bandit may choose
    group_choices: tuple[int, ...] = (2, 4, 8, 12)  # group-only draft lengths
    group_len: int = 8                          # the group branch of a fused tree
    group_max_batch: int = 64                   # group arms only while running <= this

    def __post_init__(self) -> None:
        if not self.sources or any(s not in SOURCES for s in self.sources):
            raise ValueError(f"sd sources must be a non-empty subset of {SOURCES}, got {self.sources}")
        if not self.group_choices or any(not 1 <= k <= 16 for k in self.group_choices):
            raise ValueError("group draft lengths must be non-empty and in [1, 16]")
        if not 1 <= self.group_len <= 16:
            raise ValueError("group_len must be in [1, 16]")
        if self.group_max_batch < 1:
            raise ValueError("group_max_batch must be >= 1")


class SourcePolicy(SDPolicy):
    def __init__(self, config: SDPolicyConfig | None = None, group: GroupSDConfig | None = None):
        super().__init__(config)
        self.group = group or GroupSDConfig()

    def arms(self, running: int, has_drafter: bool) -> list[Arm]:
        cfg, g = self.config, self.group
        eagle_ok = has_drafter and self.use_sd(running)
        group_ok = cfg.mode == "on" or (cfg.mode == "adaptive" and 0 < running <= g.group_max_batch)
        ks = [k for k in cfg.choices if k > 0] if cfg.fixed_k is None else [cfg.fixed_k]
        arms: list[Arm] = [("plain", 0)] if cfg.mode == "adaptive" else []
        if eagle_ok and "eagle" in g.sources:
            arms += [("eagle", k) for k in ks]
        if group_ok and "group" in g.sources:
            arms += [("group", k) for k in g.group_choices]
        if eagle_ok and group_ok and "fused" in g.sources:
            arms += [("fused", k) for k in ks]
        return arms

    def choose(self, running: int, has_drafter: bool) -> Arm:
        arms = self.arms(running, has_drafter)
        if not arms or arms == [("plain", 0)]:
            return ("plain", 0)
        if self._rng.random() < self.config.epsilon:
            return self._rng.choice(arms)
        measured = {a: r for a in arms if (r := self.mean_reward(running, _key(a))) is not None}
        if len(measured) < len(arms):                  # each arm once per bucket, the prior first
            prior = self._prior(running, arms)
            return prior if prior not in measured else next(a for a in arms if a not in measured)
        return max(measured, key=measured.__getitem__)

    def record_arm(self, running: int, arm: Arm, tokens: int, seconds: float) -> None:
        self.record(running, _key(arm), tokens, seconds)

    def measured(self) -> dict[int, dict[str, float]]:
        """Mean tokens/s per bucket and arm ("source:k"): where SD pays, per source."""
        out: dict[int, dict[str, float]] = {}
        for (bucket, key) in self._rewards:
            arm = key if isinstance(key, tuple) else ("plain", 0) if key == 0 else ("eagle", key)
            out.setdefault(bucket, {})[f"{arm[0]}:{arm[1]}"] = round(self.mean_reward(bucket, key), 1)
        return dict(sorted(out.items()))

    def _prior(self, running: int, arms: list[Arm]) -> Arm:
        """Before any measurement: the richest source available, EAGLE-3 at the table's length."""
        k = self.config.fixed_k or self.config.table[self.bucket(running)]
        for source in ("fused", "eagle"):
            if (source, k) in arms:
                return (source, k)
        group = [a for a in arms if a[0] == "group"]
        return group[len(group) // 2] if group else arms[0]


def _key(arm: Arm) -> int | Arm:
    """SDPolicy's reward key: the draft length for plain and EAGLE-3 arms, the arm itself otherwise."""
    return arm[1] if arm[0] in ("plain", "eagle") else arm
