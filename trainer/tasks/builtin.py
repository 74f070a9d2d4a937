"""The built-in tasks: small enough for a policy trained from scratch in minutes, long-tailed like chains of thought.

`Doubling` (the default): double a number k times, keeping the last three digits (2^k * x mod 1000).

    prompt (user turn):  double 4 times, keep 3 digits: 347
    solution:            347
                         04:694
                         03:388
                         02:776
                         01:552
                         \\boxed{552}

Each `remaining:value` line is a local rule (decrement; digit j of the double is 2*d_j mod 10 plus a carry when d_(j+1)
>= 5) a small model learns by SFT in minutes. k follows a truncated power law (P(k) ~ (k+1)^-alpha, 0 <= k <= max_steps;
0 is a copy): mostly short, a few very long, and longer is harder. `tail_share` > 0 (long-tail presets) draws that
share of each batch from k in [tail_min, max_steps] (count stochastically rounded: a batch of 8 at 1/8 holds one on
average). Self-checks (`checks` > 0, task `doubling_checks`): after each derivation the solution may derive again
after a `check` line, with probability `checks` (geometric, at most `max_checks` and `max_chars`), then box the result
(lines `347`, `01:694`, `check`, `347`, `01:694`, `\\boxed{694}`). The policy learns the choice (T = 1 checks as often
as its data; greedy never for `checks` < 0.5), the reward ignores it: lengths vary within a group, multiplicatively
and heavy-tailed, as chains of thought do.

`RunningSums`: running sums of a labelled list of digits (`sum: a3 b5 c2 d8` -> `a3=3 b5=8 c2=10 d8=18`, then
`\\boxed{18}`), the list length from a truncated power law (P(n) ~ n^-alpha, 1 <= n <= max_items); each step needs a
lookup and a carry. Rewards: the last \\boxed{} must equal the result (leading zeros allowed).

Their policies' tokenizer (`build_char_tokenizer`): one token per printable ASCII character (plus newline) and
ChatML's special tokens, saved as a standard `tokenizer.json` that transformers, SGLang and the embedded server load;
a small vocabulary keeps the policy's embedding and lm_head cheap.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from gleanrl.trainer.tasks.base import Task
from gleanrl.trainer.tasks.jsonl import answers_match, last_boxed

LABELS = string.ascii_lowercase + string.ascii_uppercase
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
CHARS = "\n" + "".join(c for c in string.printable if c.isprintable())  # space .. ~, 95 characters


def chatml(user: str) -> str:
    """The exact text CHAT_TEMPLATE renders for one user turn with the generation prompt."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def build_char_tokenizer():
    """PreTrainedTokenizerFast: specials first (ids 0..3), then one id per character; eos = <|im_end|>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?m)."), behavior="isolated")  # every char alone
    tok.decoder = decoders.Fuse()  # join pieces without spaces
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|unk|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


class _Boxed(Task):
    def reward(self, sample: dict, response: str) -> float:
        return 1.0 if answers_match(last_boxed(response), sample["answer"]) else 0.0


def _question(question: str, **fields) -> dict:
    """A sample: the question as the prompt text (one ChatML user turn) and as messages, then `fields`."""
    return {"prompt": chatml(question), "messages": [{"role": "user", "content": question}], **fields}


@dataclass(frozen=True)
class Doubling(_Boxed):
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
        # the start last in the question: a fixed-offset copy
        sample = _question(question, start=start, steps=k, answer=str(start * 2**k % 1000))
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


@dataclass(frozen=True)
class RunningSums(_Boxed):
    max_items: int = 52
    alpha: float = 1.4  # power-law exponent of the list length; larger = shorter lists
    name: str = "running_sums"

    def __post_init__(self) -> None:
        if not 1 <= self.max_items <= len(LABELS):
            raise ValueError(f"max_items must be in [1, {len(LABELS)}], got {self.max_items}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")

    def sample(self, rng: random.Random) -> dict:
        lengths = range(1, self.max_items + 1)
        n = rng.choices(lengths, weights=[k**-self.alpha for k in lengths])[0]
        items = [rng.randint(1, 9) for _ in range(n)]
        question = "sum: " + " ".join(f"{LABELS[i]}{d}" for i, d in enumerate(items))
        return _question(question, items=items, answer=str(sum(items)))

    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        """`n` problems, the same for the same (split, seed); splits draw from independent streams."""
        rng = random.Random(f"{self.name}/{split}/{seed}")
        return [self.sample(rng) for _ in range(n)]

    def solution(self, sample: dict) -> str:
        """The reference response (without the end-of-turn token): every partial sum, then the total."""
        steps, total = [], 0
        for i, d in enumerate(sample["items"]):
            total += d
            steps.append(f"{LABELS[i]}{d}={total}")
        return " ".join(steps) + f"\n\\boxed{{{total}}}"
