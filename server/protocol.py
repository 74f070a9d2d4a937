"""Messages between the HTTP edge and the engine. The engine is token-in, token-out; the tokenizer,
pydantic and JSON live at the edge (`server/http/`). Configs validate at construction and raise
`ValueError` naming the field, which the edge turns into a 400."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor
    from xgrammar import CompiledGrammar

MIN_TEMPERATURE = 1e-6  # below it (and above 0) SGLang samples greedily (`_SAMPLING_EPS`)
MAX_TEMPERATURE = 1e6  # finite after float32 scaling, even against -inf logits
MAX_LOGIT_BIAS = 1e6  # |bias|: finite logits after temperature scaling


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # in (0, 1]
    top_k: int = -1  # -1 or 0: disabled
    min_p: float = 0.0  # in [0, 1]
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None  # makes a sampled output reproducible
    # logits processing before temperature (SGLang's penaltylib): counts are over output tokens only
    frequency_penalty: float = 0.0  # in [-2, 2]: logit -= penalty * count(token)
    presence_penalty: float = 0.0  # in [-2, 2]: logit -= penalty if the token occurred
    repetition_penalty: float = 1.0  # in (0, 2]: an occurred token's logit / penalty (x penalty if < 0)
    min_new_tokens: int = 0  # EOS and stop token ids are masked until this many tokens exist
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop_regex: list[str] = field(default_factory=list)
    # json_schema, regex, ebnf: compiled at the edge; masks the logits (sampling/grammar)
    grammar: CompiledGrammar | None = None

    @property
    def penalised(self) -> bool:
        """Whether the logits depend on the output so far (penalties, min_new_tokens) or a bias."""
        penalties = self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
        return bool(penalties or self.min_new_tokens or self.logit_bias)

    @property
    def logits_processed(self) -> bool:
        """Penalised, biased or masked by a grammar: the logits are not the model's alone."""
        return self.penalised or self.grammar is not None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.stop_regex, str):
            self.stop_regex = [self.stop_regex]
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"sampling_params.{name} must be a finite number, got {getattr(self, name)!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = 0.0
        bad_bias = next((v for v in self.logit_bias.values() if not abs(v) <= MAX_LOGIT_BIAS), None)
        if bad_bias is not None:
            raise ValueError(
                "sampling_params.logit_bias values must be in "
                f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bad_bias!r}"
            )
        checks = [
            (
                "max_new_tokens",
                isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 0,
                "must be an integer >= 0",
            ),
            ("temperature", 0 <= self.temperature <= MAX_TEMPERATURE, f"must be in [0, {MAX_TEMPERATURE:g}]"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= -1, "must be -1 (off) or >= 0"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("n", isinstance(self.n, int) and self.n >= 1, "must be an integer >= 1"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            (
                "repetition_penalty",
                MIN_TEMPERATURE <= self.repetition_penalty <= 2,
                f"must be in [{MIN_TEMPERATURE:g}, 2] (1.0 = no penalty)",
            ),
            (
                "min_new_tokens",
                isinstance(self.min_new_tokens, int) and 0 <= self.min_new_tokens <= self.max_new_tokens,
                f"must be in [0, max_new_tokens({self.max_new_tokens})]",
            ),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"sampling_params.{name} {why}, got {getattr(self, name)!r}")


@dataclass(slots=True)
class GenerateRequest:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1  # >= 0: input logprobs from this prompt position on
    top_logprobs_num: int = 0  # k > 0: the k most likely tokens at each position
    token_ids_logprob: list[int] | None = None  # logprobs of these ids at each position

    def __post_init__(self) -> None:
        if self.logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be >= -1, got {self.logprob_start_len}")
        if self.logprob_start_len > len(self.input_ids):
            raise ValueError(
                f"logprob_start_len={self.logprob_start_len} is higher than the number of input tokens "
                f"{len(self.input_ids)}. Please use a smaller logprob_start_len."
            )
        if self.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be >= 0, got {self.top_logprobs_num}")


@dataclass(slots=True)
class PromptLogprobs:
    """A prompt's own logprobs as the engine scored them (`server/sampling/prompt_scores.py`), tensors: cheap to send
    between processes. Rows are positions [first, L), first = min(start, L - 1): `token` [n - 1] log p(ids[p + 1]),
    `top_values` / `top_ids` [n, k], `picked` [n, m] (the request's `token_ids_logprob`)."""

    start: int
    token: Tensor
    top_values: Tensor
    top_ids: Tensor
    picked: Tensor

    def as_lists(self, ids: list[int], token_ids: list[int] | None) -> dict[str, list]:
        """SGLang's shape: {"token": [(lp | None, id)], "top": [pairs | None], "ids": [pairs | None]} for positions
        [start, L) (entry 0 is None: nothing predicts it), and "next_top", "next_ids": the pairs at the position after
        the prompt."""
        top = [list(zip(v, i)) for v, i in zip(self.top_values.tolist(), self.top_ids.tolist())]
        picked = [list(zip(v, token_ids or [])) for v in self.picked.tolist()]
        out = {"token": [], "top": [], "ids": [], "next_top": top[-1], "next_ids": picked[-1]}
        if self.start < len(ids):
            out["token"] = [(None, ids[self.start])] + list(zip(self.token.tolist(), ids[self.start + 1 :]))
            out["top"] = [None] + top[:-1] if self.top_values.shape[-1] else []
            out["ids"] = [None] + picked[:-1] if token_ids else []
        return out


@dataclass(slots=True)
class GenerateOutput:
    """One update for a request. The engine emits deltas (`new_ids`, `new_logprobs` since the previous update); the last
    update has `finished=True` and `finish_reason` set (SGLang's shape: {"type": "stop", "matched": token_id |
    "string"} | {"type": "length", "length": n} | {"type": "abort", "message": ...})."""

    rid: str
    new_ids: list[int]
    new_logprobs: list[float]  # log p of each new token under the target's distribution (see engine)
    finished: bool = False
    finish_reason: dict | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # total so far
    weight_version: str = "default"
    draft_weight_version: str | None = None
    weight_versions: list[dict] | None = None  # final update: [{"version", "start", "end"}] over output tokens
    spec_verify_ct: int = 0  # target verify passes (0 without SD)
    spec_accept_token_num: int = 0  # draft tokens accepted by them (no bonus token)
    spec_draft_token_num: int = 0  # draft tokens they verified
    num_retractions: int = 0  # times a retract pause put it back in the queue
    # per new token, when asked (top_logprobs_num, token_ids_logprob): [(logprob, token_id), ...]
    new_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    new_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    prompt_logprobs: PromptLogprobs | None = None  # once, in the first update after the prefill, when asked
    spec_accept_token_num_by_source: dict[str, int] | None = None  # gleanrl: accepted drafts by source

    @property
    def spec_accept_length(self) -> float:
        return self.completion_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0

    def meta_info(self) -> dict:
        """The engine's part of SGLang's `meta_info` (versions and SD stats, SGLang's names). As SGLang 0.5.23's
        tokenizer manager: `spec_accept_length` = completion tokens / verify passes (the prefill's token included),
        `spec_accept_rate` = accepted / verified draft tokens; slime's `Sample.SpecInfo` reads `spec_accept_token_num`
        and `spec_draft_token_num` (SGLang <= 0.5.9's names of `spec_num_correct_drafts`/`spec_num_proposed_drafts`)."""
        ct, drafts = self.spec_verify_ct, self.spec_draft_token_num
        info = {
            "weight_version": self.weight_version,
            "draft_weight_version": self.draft_weight_version,
            "num_retractions": self.num_retractions,
            "spec_verify_ct": ct,
            "spec_accept_length": self.spec_accept_length,
            "spec_accept_rate": self.spec_accept_token_num / drafts if drafts else 0.0,
            "spec_accept_token_num": self.spec_accept_token_num,
            "spec_draft_token_num": drafts,
            "spec_num_correct_drafts": self.spec_accept_token_num,
            "spec_num_proposed_drafts": drafts,
        }
        if self.weight_versions is not None:
            info["weight_versions"] = self.weight_versions
        if self.spec_accept_token_num_by_source:
            info["spec_accept_token_num_by_source"] = self.spec_accept_token_num_by_source
        return info


class CheckpointError(ValueError):
    """A weight update was refused; the message says why. The engine keeps serving what it served."""


# what a harvest feed record carries of a /generate answer's meta_info, besides the weight version
FEED_META = ("spec_verify_ct", "spec_accept_length", "spec_accept_token_num", "draft_weight_version")
