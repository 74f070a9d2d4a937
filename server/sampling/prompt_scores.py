"""Logprobs of a prompt's own tokens (SGLang's `input_token_logprobs`, `input_top_logprobs`, `input_token_ids_logprobs`
for `logprob_start_len` >= 0, e.g. slime's on-policy distillation with `max_new_tokens: 0`), scored inside the prefill
that the request runs anyway, as SGLang does: the rows of positions [first, L) of each prefill chunk go through the LM
head beside the sampling rows (`sequence.forward_fed`), with `first = min(start, L - 1)` (the last position, the one
after the prompt, is always scored: SGLang's `output_top_logprobs` of a `max_new_tokens: 0` request).

Values under the raw logits (no temperature, no penalties). A scored prompt feeds at most SCORE_CHUNK tokens per
iteration, so one iteration's [rows, V] log-softmax is bounded. A prefix fed again before the scores are complete (a
weight update flushed the caches, or a retraction) is scored again from `first`, so every score of a prompt comes from
one set of weights. The engine sends the scores as tensors (`PromptLogprobs`); the HTTP edge turns them into lists."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gleanrl.server.protocol import GenerateRequest, PromptLogprobs

SCORE_CHUNK = 512  # prompt tokens a scored prompt feeds per iteration


@dataclass
class PromptScores:
    """The scores of one request's prompt, filled chunk by chunk during its prefill."""

    req: GenerateRequest
    scored: int  # positions [first, scored) are done
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    sent: bool = False

    @classmethod
    def of(cls, req: GenerateRequest) -> PromptScores | None:
        if not req.return_logprob or req.logprob_start_len < 0:
            return None
        return cls(req, scored=min(req.logprob_start_len, len(req.input_ids) - 1))

    @property
    def start(self) -> int:
        """The request's logprob_start_len, at most L."""
        return min(self.req.logprob_start_len, len(self.req.input_ids))

    @property
    def first(self) -> int:
        return min(self.start, len(self.req.input_ids) - 1)

    @property
    def done(self) -> bool:
        return self.scored == len(self.req.input_ids)

    def positions(self, start: int, count: int) -> range:
        """The positions to score among the fed ones, [start, start + count)."""
        if self.done:
            return range(0)
        if start < self.scored and self.scored > self.first:  # fed again from the start: new weights, or retracted
            self.scored, self.parts = self.first, []
        lo, hi = max(start, self.scored), min(start + count, len(self.req.input_ids))
        return range(lo, hi) if lo == self.scored and lo < hi else range(0)

    def add(self, logits: torch.Tensor, positions: range) -> None:
        """logits [len(positions), V] of those positions."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        req = self.req
        nxt = torch.tensor(req.input_ids[positions.start + 1 : positions.stop + 1], dtype=torch.long, device=lp.device)
        token = lp[: len(nxt)].gather(-1, nxt[:, None])[:, 0]  # one short on the prompt's last position
        k = min(req.top_logprobs_num, lp.shape[-1])
        top = lp.topk(k, dim=-1) if k > 0 else (lp[:, :0], lp[:, :0].long())
        ids = req.token_ids_logprob
        picked = lp[:, torch.tensor(ids, device=lp.device)] if ids else lp[:, :0]
        self.parts.append((token.cpu(), top[0].cpu(), top[1].cpu(), picked.cpu()))
        self.scored = positions.stop

    def take(self) -> PromptLogprobs | None:
        """The whole record, once, when every position is scored."""
        if not self.done or self.sent:
            return None
        self.sent = True
        token, top_values, top_ids, picked = (torch.cat(t) for t in zip(*self.parts))
        return PromptLogprobs(self.start, token, top_values, top_ids, picked)
