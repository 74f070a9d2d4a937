"""When to speculate and how far: TLT's adaptive SD policy.

SD pays when the target is memory-bound (few running requests) and costs when it is compute-bound, so
in `adaptive` mode it runs only while `running <= max_batch`. The draft length k is chosen per
batch-size bucket by an epsilon-greedy bandit (TLT's bucketed epsilon-greedy) whose reward is emitted
tokens per second of the decode iteration, and arm 0 (plain decoding) competes too, so SD is dropped in
a bucket where it does not pay; each arm keeps a sliding window of recent rewards, so the
choice follows a drifting drafter (acceptance rises as it trains). A bucket with no measured arm uses
the fixed table, the prior. A drafter hot swap keeps the knowledge but lowers its weight (`decay`):
the old ranking stands until the new drafter's measurements, which count more, override it, and
measurements that were never renewed fade out, back to the prior. Simplified relative to TLT: the arms
are draft lengths of a chain draft only (TLT also varies tree top-k and the number of verified tokens).
"""
from __future__ import annotations

import bisect
import random
from collections import deque
from dataclasses import dataclass, field

# batch-size bucket upper bound -> draft length, used before a bucket has measurements
DEFAULT_TABLE: dict[int, int] = {1: 4, 2: 4, 4: 3, 8: 2, 16: 2, 32: 1}


@dataclass(frozen=True, slots=True)
class SDPolicyConfig:
    mode: str = "adaptive"                       # off | on | adaptive
    max_batch: int = 8                           # adaptive: SD only while running <= max_batch
    fixed_k: int | None = None                   # a fixed draft length disables the bandit
    choices: tuple[int, ...] = (0, 1, 2, 3, 4, 6)  # the bandit's arms (draft lengths; 0 = plain decoding)
    table: dict[int, int] = field(default_factory=lambda: dict(DEFAULT_TABLE))
    epsilon: float = 0.1
    window: int = 16                             # recent rewards kept per (bucket, arm)
    swap_decay: float = 0.5                      # weight a measurement keeps across a drafter swap
    min_weight: float = 0.05                     # measurements lighter than this are forgotten
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("off", "on", "adaptive"):
            raise ValueError(f"sd mode must be off, on or adaptive, got {self.mode!r}")
        if self.max_batch < 1:
            raise ValueError("sd max_batch must be >= 1")
        if self.fixed_k is not None and not 1 <= self.fixed_k <= 16:
            raise ValueError("fixed draft length must be in [1, 16]")
        if not self.choices or any(not 0 <= k <= 16 for k in self.choices):
            raise ValueError("draft length choices must be non-empty and in [0, 16]")
        if not self.table or any(not 1 <= k <= 16 for k in self.table.values()):
            raise ValueError("table draft lengths must be in [1, 16]")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError("epsilon must be in [0, 1]")
        if self.window < 1:
            raise ValueError("window must be >= 1")
        if not 0.0 < self.swap_decay <= 1.0:
            raise ValueError("swap_decay must be in (0, 1] (a drafter swap keeps the policy's knowledge)")
        if not 0.0 <= self.min_weight < 1.0:
            raise ValueError("min_weight must be in [0, 1)")


class SDPolicy:
    def __init__(self, config: SDPolicyConfig | None = None):
        self.config = config or SDPolicyConfig()
        self._bounds = sorted(self.config.table)
        self._rng = random.Random(self.config.seed)
        self._rewards: dict[tuple[int, int], deque[tuple[float, float]]] = {}  # (reward, weight)

    def use_sd(self, running: int) -> bool:
        mode = self.config.mode
        return mode == "on" or (mode == "adaptive" and 0 < running <= self.config.max_batch)

    def bucket(self, batch: int) -> int:
        """The smallest bucket bound >= batch (the largest bound for bigger batches)."""
        i = bisect.bisect_left(self._bounds, batch)
        return self._bounds[min(i, len(self._bounds) - 1)]

    def mean_reward(self, batch: int, k: int) -> float | None:
        window = self._rewards.get((self.bucket(batch), k))
        if not window:
            return None
        return sum(r * w for r, w in window) / sum(w for _, w in window)

    def choose_k(self, batch: int) -> int:
        cfg = self.config
        if cfg.fixed_k is not None:
            return cfg.fixed_k
        arms = cfg.choices if cfg.mode == "adaptive" else tuple(k for k in cfg.choices if k > 0) or (1,)
        if self._rng.random() < cfg.epsilon:
            return self._rng.choice(arms)
        measured = {k: r for k in arms if (r := self.mean_reward(batch, k)) is not None}
        if not measured:
            return cfg.table[self.bucket(batch)]
        return max(measured, key=measured.__getitem__)

    def record(self, batch: int, k: int, tokens: int, seconds: float) -> None:
        """One SD decode iteration over `batch` sequences with draft length k emitted `tokens`."""
        if seconds <= 0:
            return
        key = (self.bucket(batch), k)
        self._rewards.setdefault(key, deque(maxlen=self.config.window)).append((tokens / seconds, 1.0))

    def decay(self) -> None:
        """After a drafter swap: every measurement keeps `swap_decay` of its weight; those below
        `min_weight` are dropped, so an arm that is not measured again fades back to the table."""
        cfg = self.config
        for key, window in list(self._rewards.items()):
            kept = [(r, w * cfg.swap_decay) for r, w in window if w * cfg.swap_decay >= cfg.min_weight]
            if kept:
                self._rewards[key] = deque(kept, maxlen=cfg.window)
            else:
                del self._rewards[key]
