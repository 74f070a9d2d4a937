"""Math-answer reward for GSM8K/MATH-style data: the last `\\boxed{...}` in the response (else the last number),
normalised, against the reference answer; numbers and simple fractions compare by value.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if absent or unclosed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(response: str) -> str | None:
    """The final answer a response states: the last \\boxed{} content, else its last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


def normalize(answer: str) -> str:
    """Canonical text: no spaces, $, \\left/\\right, \\text{}, trailing period or thousands separators."""
    s = answer.strip()
    if "####" in s:  # GSM8K reference solutions end with "#### 72"
        s = s.rsplit("####", 1)[1]
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    for junk in ("$", "\\left", "\\right", "\\!", "\\,", "\\%", "%", " "):
        s = s.replace(junk, "")
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def to_number(s: str) -> float | None:
    """Value of an integer, decimal, a/b or \\frac{a}{b}; None for anything else."""
    m = _FRAC.match(s)
    if m:
        s = f"{m.group(1)}{m.group(2)}/{m.group(3)}"
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return float(num) / float(den)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, reference: str) -> bool:
    if predicted is None:
        return False
    p, r = normalize(predicted), normalize(str(reference))
    if not p:
        return False
    pv, rv = to_number(p), to_number(r)
    if pv is not None and rv is not None:
        return abs(pv - rv) <= 1e-6 * max(1.0, abs(rv))
    return p == r


def math_reward(response: str, reference: str) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0."""
    return 1.0 if answers_match(extract_answer(response), reference) else 0.0
