"""Acceptance estimates for the SD controller (`controller.py`): conditional acceptance per draft depth from decayed
counts of tries and accepted tokens; EAGLE-3 pooled and per sequence, group drafts per (depth bin, estimate bin)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gleanrl.server.sampling.sequence import Sequence

MAX_DEPTH = 32
EXPLORE_PRIOR = 0.7  # EAGLE-3's acceptance when exploring
DEEPER = 0.9  # an unmeasured depth's prior: this x the depth before it
SEQ_PRIOR = 4.0  # weight of the pooled rate in a sequence's own estimate
_PROB_BINS = (0.5, 0.7, 0.85, 0.95)  # group estimate bins: < .5, .5-.7, ... >= .95
_DEPTH_BINS = (1, 2, 4, 8, 16)  # group depth bins: 1, 2, 3-4, 5-8, 9-16, 17-32


@dataclass
class _Counts:
    tries: np.ndarray = field(default_factory=lambda: np.zeros(MAX_DEPTH))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(MAX_DEPTH))

    def rate(self, prior: np.ndarray, weight: float = 2.0) -> np.ndarray:
        return (self.accepted + weight * prior) / (self.tries + weight)

    def add(self, index: tuple, accepted: bool, decay: float) -> None:
        self.tries[index] = self.tries[index] * decay + 1
        self.accepted[index] = self.accepted[index] * decay + accepted


class Acceptance:
    """Conditional acceptance per draft depth: EAGLE-3 by depth, pooled and per sequence (shrunk to the pooled rate),
    group drafts by (depth bin, estimate bin). No optimistic prior: an EAGLE-3 depth not measured counts as rejected
    (prior 0 of weight 1) unless the plan explores."""

    def __init__(self, decay: float = 0.995):
        self.decay = decay
        self.version = 0  # counts the records
        self.eagle = _Counts()
        self.by_seq: dict[Sequence, _Counts] = {}  # sequence -> its EAGLE-3 counts
        shape = (len(_DEPTH_BINS) + 1, len(_PROB_BINS) + 1)
        self.group = _Counts(np.zeros(shape), np.zeros(shape))
        self._group_prior = np.array([[0.4, 0.6, 0.78, 0.9, 0.97]] * shape[0])

    def eagle_rates(self, explore: bool = False) -> np.ndarray:
        """[MAX_DEPTH] pooled conditional acceptance of the EAGLE-3 chain's token j + 1: measured counts over a prior of
        weight 1: DEEPER x the estimate of the depth before it where that one is measured, else 0 (unmeasured: not worth
        drafting; a chain grows one measured depth at a time); `explore`: the optimistic prior (0.7, weight 2)."""
        if explore:
            return self.eagle.rate(np.full(MAX_DEPTH, EXPLORE_PRIOR))
        rates, prior = np.zeros(MAX_DEPTH), 0.0
        tries, accepted = self.eagle.tries.tolist(), self.eagle.accepted.tolist()
        for j in range(MAX_DEPTH):  # depth j's prior: depth j - 1's estimate, discounted
            rates[j] = (accepted[j] + prior) / (tries[j] + 1.0)
            prior = DEEPER * rates[j] if tries[j] >= 0.5 else 0.0
        return rates

    def measured_depths(self) -> int:
        """The leading EAGLE-3 depths measured at least once (pooled)."""
        unmeasured = np.flatnonzero(self.eagle.tries < 0.5)
        return int(unmeasured[0]) if unmeasured.size else MAX_DEPTH

    def seq_eagle_rates(self, keys: list[Sequence], explore: bool = False) -> np.ndarray:
        """[B, MAX_DEPTH] each sequence's own counts shrunk to the pooled rates (of weight SEQ_PRIOR)."""
        pooled = self.eagle_rates(explore)
        out = np.tile(pooled, (len(keys), 1))
        for i, key in enumerate(keys):
            c = self.by_seq.get(key)
            if c is not None:
                out[i] = c.rate(pooled, SEQ_PRIOR)
        return out

    def record(
        self, source: str, n_tried: int, n_accepted: int, probs: list[float] | None = None, key: Sequence | None = None
    ) -> None:
        """A branch of n_tried tokens whose first n_accepted were accepted (tokens after the first rejection were not
        tested); `key`: the sequence, for its own EAGLE-3 counts."""
        tested = min(n_accepted + 1, n_tried)
        self.version += 1
        if source == "eagle":
            own = self.by_seq.setdefault(key, _Counts()) if key is not None else None
            for j in range(tested):
                self.eagle.add((j,), j < n_accepted, self.decay)
                if own is not None:
                    own.add((j,), j < n_accepted, 1.0)
        else:
            p = np.searchsorted(_PROB_BINS, probs[:tested], side="right")  # estimate bins
            for j in range(tested):
                self.group.add((_DEPTH_IDX[j], p[j]), j < n_accepted, self.decay)

    def keep_only(self, keys: list[Sequence]) -> None:
        """Forget the per-sequence counts of sequences no longer running."""
        if len(self.by_seq) > 2 * len(keys) + 8:
            alive = set(keys)
            self.by_seq = {k: c for k, c in self.by_seq.items() if k in alive}

    def group_expected(self, group_probs: list[list[float]], lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expected accepted tokens [B, 33] of each group draft's first 0..32 tokens (flat beyond its usable length
        lens[s]), and its first token's acceptance [B]."""
        b = len(group_probs)
        probs = np.zeros((b, MAX_DEPTH))
        for s, p in enumerate(group_probs):
            probs[s, : min(len(p), MAX_DEPTH)] = p[:MAX_DEPTH]
        rates = self.group.rate(self._group_prior)[_DEPTH_IDX[None], np.searchsorted(_PROB_BINS, probs, side="right")]
        rates = np.where(np.arange(MAX_DEPTH)[None] < lens[:, None], rates, 0.0)  # [B, 32]
        return expected_accepted(rates), rates[:, 0]

    def drafter_swapped(self) -> None:
        """The old drafter's evidence stays as a prior that weighs half."""
        self.version += 1
        for c in (self.eagle, *self.by_seq.values()):
            c.tries *= 0.5
            c.accepted *= 0.5


_DEPTH_IDX = np.searchsorted(_DEPTH_BINS, np.arange(1, MAX_DEPTH + 1), side="left")  # [32] depth bin


def expected_accepted(rates: np.ndarray) -> np.ndarray:
    """rates [..., L] conditional acceptances -> [..., L + 1] expected accepted tokens of a chain's first 0..L."""
    cum = np.cumsum(np.cumprod(rates, axis=-1), axis=-1)
    return np.concatenate([np.zeros(rates.shape[:-1] + (1,)), cum], axis=-1)
