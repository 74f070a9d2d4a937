"""When a trained drafter replaces the serving one: a paired test on held-out prompts.

Both drafters are scored on the same held-out samples, each giving (sum of accept lengths, start slots). One
prompt's samples are not independent (GRPO siblings, later steps), so the test clusters by prompt: with D_c the
candidate's minus the serving drafter's summed accept lengths over prompt c and N_c its slots, the gain in tokens
per verify pass is G = sum D_c / sum N_c, its cluster-robust se^2 = C/(C-1) sum_c (D_c - G N_c)^2 / (sum_c N_c)^2
(C prompts). A push needs `min_prompts` prompts, `min_samples` samples and the lower bound G - t se above
`min_gain` (t: Student's quantile at z's confidence, C - 1 degrees of freedom: few prompts need more evidence);
inside a step above `mid_step_gain` (else it waits for the boundary). `Gate.decide` says which, and why in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    gain: float  # tokens per verify pass, candidate minus serving
    se: float  # cluster-robust standard error of the gain
    lower: float  # gain - t * se
    prompts: int
    samples: int
    candidate: float  # pooled accept lengths
    serving: float

    def row(self) -> dict:
        row = {"candidate": self.candidate, "serving": self.serving, "gain": self.gain, "gain_se": self.se}
        return row | {"gain_lower": self.lower, "prompts": self.prompts, "samples": self.samples}


def t_quantile(z: float, df: int) -> float:
    """Student's t quantile at the normal quantile z (Cornish-Fisher expansion to 1/df^2)."""
    if df < 1:
        return math.inf
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def paired_verdict(
    candidate: list[tuple[float, int]], serving: list[tuple[float, int]], prompts: list[int], z: float = 2.0
) -> Verdict | None:
    """Per held-out sample: the two drafters' (sum, count) and its prompt; None without slots."""
    clusters: dict[int, list[float]] = {}
    for (c, n), (s, _), key in zip(candidate, serving, prompts, strict=True):
        acc = clusters.setdefault(key, [0.0, 0.0, 0.0])
        acc[0] += c - s
        acc[1] += n
        acc[2] += s
    total = sum(n for _, n, _ in clusters.values())
    if not total:
        return None
    gain = sum(d for d, _, _ in clusters.values()) / total
    k = len(clusters)
    var = k / (k - 1) * sum((d - gain * n) ** 2 for d, n, _ in clusters.values()) / total**2 if k > 1 else math.inf
    se = math.sqrt(var)
    serve = sum(s for _, _, s in clusters.values()) / total
    return Verdict(gain, se, gain - t_quantile(z, k - 1) * se, k, len(candidate), serve + gain, serve)


@dataclass(frozen=True, slots=True)
class Gate:
    min_prompts: int
    min_samples: int
    min_gain: float
    mid_step_gain: float

    def decide(self, v: Verdict | None, boundary: bool) -> tuple[str, str]:
        """("push" | "pending" (won, but waits for the step boundary) | "hold", why)."""
        if v is None:
            return "hold", "no held-out sample of the newest policy versions yet"
        if v.prompts < self.min_prompts:
            return "hold", f"held-out prompts {v.prompts} of the {self.min_prompts} needed"
        if v.samples < self.min_samples:
            return "hold", f"held-out samples {v.samples} of the {self.min_samples} needed"
        figures = (
            f"gain {v.gain:+.3f} ± {v.se:.3f} tokens/pass ({v.candidate:.2f} vs "
            f"{v.serving:.2f}) on {v.prompts} prompts, lower bound {v.lower:+.3f}"
        )
        if v.lower <= self.min_gain:
            return "hold", f"{figures}: not above {self.min_gain}"
        if not boundary and v.lower <= self.mid_step_gain:
            return "pending", (f"{figures} (a swap while rollouts run needs a lower bound above {self.mid_step_gain})")
        return "push", figures


def status_line(attempt: dict | None, since_push: int, push_every: int) -> str:
    """A push attempt's outcome (`attempt`: a `Harvester.history` row), else how far the next attempt is."""
    if attempt is None:
        if not push_every:
            return "pushes off"
        if since_push >= push_every:
            return "a push attempt is due at the next micro-step (the last window closed first)"
        return f"no push attempt yet: {since_push} of the {push_every} drafter micro-steps between attempts"
    if attempt.get("error"):
        return f"push refused: {attempt['error']}"
    if attempt.get("pushed"):
        done = "pushed v{}".format(attempt["version"])
    else:
        done = "won, waits for the step boundary" if attempt.get("pending") else "held"
    return f"{done}: {attempt.get('why', '')}"
