"""What real iterations say about SD, per running bucket (`controller.py` decides from it).

- Cells: realised speed of SD per cell (running bucket, source, depth bucket): output tokens per second of whole
  iterations (drafter call and catch-up included) over plain decoding's rate at the same batch, an EMA. A cell pays when
  measured MIN_SAMPLES times above PAY, loses when measured as often at or below it.
- Probe credit: a plan whose cell has not measured to pay is a probe. Probes are paid from a per-bucket credit that
  every iteration of the bucket feeds with BUDGET of its seconds and that every drafting iteration charges with the
  seconds it lost to plain (time taken minus the time plain would take for the same tokens; a gain refunds, up to CAP
  plain iterations' worth). A bucket starts with CAP plain iterations' worth, so one unlucky first probe (a rejected
  first draft) does not shut it off for ~1 / BUDGET iterations. A probe plays only while the credit is positive, so
  exploration costs at most CAP plain iterations once, then about BUDGET of a bucket's time (invariant: the credit never
  exceeds CAP plain iterations' seconds).
- Acceptance floor: an EMA per bucket of the EAGLE-3 draft tokens accepted per chain. Below the floor (the acceptance at
  which the cheapest chain, one token, only breaks even), the drafter is dropped for the bucket: its EAGLE-3 cells count
  as unmeasured (plans there are credit-paid probes) until a probe measures the acceptance back above the floor, or a
  new drafter comes."""

from __future__ import annotations

from gleanrl.server.sd.cost_model import b_bucket, ema

# a cell pays: measured this often, realised rate > PAY x plain's (margin: plain's is an estimate, noisy on shared CPUs)
MIN_SAMPLES, PAY = 3, 1.05
REPROBE = 8  # refusals of a losing cell per retry
BUDGET, CAP = 0.005, 4.0  # probe credit: share of the bucket's seconds; most plain iterations saved
ACCEPT_ALPHA = 0.5  # EMA weight of a chain's acceptance


class Cells:
    def __init__(self) -> None:
        self.cells: dict[tuple, list] = {}  # key -> [samples, ratio, refusals]
        self.credit: dict[int, float] = {}  # bucket -> probe credit, seconds
        self.accept: dict[int, float] = {}  # bucket -> EAGLE-3 tokens per chain
        self.dropped: set[int] = set()  # buckets whose drafter is dropped

    @staticmethod
    def key(b: int, plan) -> tuple:
        if any(plan.eagle_lens):
            return b_bucket(b), "eagle", b_bucket(max(plan.eagle_lens))
        return b_bucket(b), "group", b_bucket(max(plan.group_lens))

    def record(self, b: int, plan, tokens: int, seconds: float) -> None:
        """A whole drafting iteration: its cell's realised ratio and the bucket's credit."""
        if plan.plain_rate <= 0 or seconds <= 0 or not plan.drafts:
            return
        c = self.cells.setdefault(self.key(b, plan), [0, None, 0])
        c[0] += 1
        c[1] = ema(c[1], tokens / seconds / plan.plain_rate, max(0.2, 1 / c[0]))
        lost = seconds - tokens / plan.plain_rate  # < 0: a gain, refunded
        self.feed(b_bucket(b), seconds, b / plan.plain_rate, lost)

    def feed(self, bucket: int, seconds: float, plain_seconds: float, lost: float = 0.0) -> None:
        """Any iteration of the bucket earns BUDGET of its seconds, less what it lost to plain; the credit starts at,
        and is capped at, CAP plain iterations' seconds."""
        credit = self.credit.get(bucket, CAP * plain_seconds) + BUDGET * seconds - lost
        self.credit[bucket] = min(credit, CAP * plain_seconds) if plain_seconds > 0 else credit

    def can_probe(self, b: int) -> bool:
        """Unspent credit: a bucket never measured has its first probe free (credit 0 counts)."""
        return self.credit.get(b_bucket(b), 0.0) >= 0.0

    def record_acceptance(self, b: int, chains: int, accepted: int, floor: float) -> None:
        """An iteration verified `chains` EAGLE-3 chains, `accepted` of their tokens accepted in all; `floor`: the
        break-even tokens per chain of the cheapest chain."""
        if chains <= 0:
            return
        bucket = b_bucket(b)
        rate = self.accept[bucket] = ema(self.accept.get(bucket), accepted / chains, ACCEPT_ALPHA)
        if rate < floor and bucket not in self.dropped:
            self.dropped.add(bucket)
            for key, c in self.cells.items():  # re-measured before they pay again
                if key[0] == bucket and key[1] == "eagle":
                    c[0] = min(c[0], MIN_SAMPLES - 1)
        elif rate >= floor:
            self.dropped.discard(bucket)

    def pays(self, key: tuple) -> bool:
        c, dropped = self.cells.get(key), key[1] == "eagle" and key[0] in self.dropped
        return c is not None and c[0] >= MIN_SAMPLES and c[1] > PAY and not dropped

    def loses(self, key: tuple) -> bool:
        c = self.cells.get(key)
        return c is not None and c[0] >= MIN_SAMPLES and c[1] <= PAY

    def any_pays(self, bucket: int) -> bool:
        return any(key[0] == bucket and self.pays(key) for key in self.cells)

    def allowed(self, b: int, key: tuple) -> bool:
        """May a plan of this cell play now? A paying cell always; any other is a probe: it needs credit, and a losing
        cell plays only every REPROBE-th time it is refused."""
        if self.pays(key):
            return True
        if not self.can_probe(b):
            return False
        c = self.cells.get(key)
        if c is None or c[0] < MIN_SAMPLES:
            return True
        c[2] = (c[2] + 1) % REPROBE
        return c[2] == 0

    def drafter_swapped(self) -> None:
        """EAGLE-3 cells keep their figure as a prior, re-measured from the next play on; a new drafter is not held to
        the old one's collapse."""
        for key, c in self.cells.items():
            if key[1] == "eagle":
                c[0] = min(c[0], MIN_SAMPLES - 1)
        self.dropped.clear()
        self.accept.clear()
