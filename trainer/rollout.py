"""The one record for a rollout. It flows from the client to the rewards, the loss and the harvester."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RolloutStatus(str, enum.Enum):
    PENDING = "pending"        # not submitted yet, or to be re-submitted
    FINISHED = "finished"      # stopped on EOS / a stop token or string
    TRUNCATED = "truncated"    # hit max_new_tokens or the context length
    ABORTED = "aborted"        # aborted by the server (restart, pause, abort_request)
    FAILED = "failed"          # the request errored; `error` says why


@dataclass(slots=True)
class Rollout:
    group_id: int                         # rollouts of one prompt share a group (GRPO baseline)
    index: int                            # position within the group
    sample: dict                          # the task's prompt record ("prompt" text, answer, ...)
    prompt_ids: list[int]
    rid: str = ""
    seed: int | None = None               # sampling seed sent to the server
    status: RolloutStatus = RolloutStatus.PENDING
    output_ids: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)   # server's log p of each output token
    finish_reason: dict | None = None
    weight_version: str | None = None
    draft_weight_version: str | None = None
    response: str = ""
    reward: float | None = None
    error: str | None = None
    attempts: int = 0
    submitted_at: float | None = None     # time.monotonic()
    first_token_at: float | None = None
    finished_at: float | None = None
    spec_verify_ct: int = 0
    spec_accept_length: float = 0.0

    @property
    def prompt(self) -> str:
        return self.sample.get("prompt", "")

    @property
    def done(self) -> bool:
        return self.status in (RolloutStatus.FINISHED, RolloutStatus.TRUNCATED)

    def reset(self) -> None:
        """Back to pending for a re-submission (after a server restart or a version mismatch)."""
        self.status = RolloutStatus.PENDING
        self.output_ids, self.rollout_logprobs = [], []
        self.finish_reason = self.weight_version = self.draft_weight_version = self.error = None
        self.submitted_at = self.first_token_at = self.finished_at = None

    def apply(self, body: dict) -> None:
        """Fill from a final /generate response (SGLang's native shape)."""
        meta = body.get("meta_info", {})
        self.output_ids = list(body.get("output_ids") or [])
        lps = meta.get("output_token_logprobs") or []
        self.rollout_logprobs = [float(lp[0]) for lp in lps]
        if lps and not self.output_ids:
            self.output_ids = [int(lp[1]) for lp in lps]
        self.response = body.get("text", "")
        self.finish_reason = meta.get("finish_reason")
        self.weight_version = _str_or_none(meta.get("weight_version"))
        self.draft_weight_version = _str_or_none(meta.get("draft_weight_version"))
        self.spec_verify_ct = int(meta.get("spec_verify_ct") or 0)
        self.spec_accept_length = float(meta.get("spec_accept_length") or 0.0)
        kind = (self.finish_reason or {}).get("type")
        if kind == "stop":
            self.status = RolloutStatus.FINISHED
        elif kind == "length":
            self.status = RolloutStatus.TRUNCATED
        else:
            self.status = RolloutStatus.ABORTED
            self.error = str((self.finish_reason or {}).get("message", "no finish reason"))
        if self.done and len(self.rollout_logprobs) != len(self.output_ids):
            self.status, self.error = RolloutStatus.FAILED, (
                f"{len(self.rollout_logprobs)} logprobs for {len(self.output_ids)} output tokens")


def _str_or_none(value) -> str | None:
    return None if value is None else str(value)
