"""The one record for a rollout, filled by the client from SGLang's /generate response (`run_rollout`); it flows on to
the rewards, the loss and the harvester (as a `FinishedRollout`, which the sidecar builds from a feed record).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import httpx

from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.transport import RolloutServerError


@dataclass(slots=True)
class FinishedRollout:
    """What the harvest takes of a finished rollout."""

    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    weight_version: str | None = None
    draft_weight_version: str | None = None
    spec_verify_ct: int = 0  # SD verify passes
    spec_accept_token_num: int = 0  # draft tokens those passes accepted
    spec_accept_token_num_by_source: dict[str, int] = field(default_factory=dict)  # gleanrl's

    @property
    def sd_tokens(self) -> int:
        """Output tokens from verify passes: each emits the drafts it accepted and one of its own."""
        return self.spec_verify_ct + self.spec_accept_token_num

    def read_meta(self, meta: dict) -> FinishedRollout:
        """Versions and SD counters from a /generate answer's `meta_info` (or a feed record)."""
        self.weight_version = _str_or_none(meta.get("weight_version"))
        self.draft_weight_version = _str_or_none(meta.get("draft_weight_version"))
        self.spec_verify_ct = int(meta.get("spec_verify_ct") or 0)
        self.spec_accept_token_num = int(meta.get("spec_accept_token_num") or 0)
        by_source = meta.get("spec_accept_token_num_by_source") or {}
        self.spec_accept_token_num_by_source = {str(k): int(v) for k, v in by_source.items()}
        return self


def _str_or_none(value) -> str | None:
    return None if value is None else str(value)


class RolloutStatus(str, enum.Enum):
    PENDING = "pending"  # not submitted yet, or to be re-submitted
    FINISHED = "finished"  # stopped on EOS / a stop token or string
    TRUNCATED = "truncated"  # hit max_new_tokens or the context length
    ABORTED = "aborted"  # aborted by the server (restart, pause, abort_request)
    FAILED = "failed"  # the request errored; `error` says why


@dataclass(slots=True, kw_only=True)
class Rollout(FinishedRollout):
    group_id: int  # rollouts of one prompt share a group (GRPO baseline)
    index: int  # position within the group
    sample: dict  # the task's prompt record ("prompt" text, answer, ...)
    rid: str = ""
    seed: int | None = None  # sampling seed sent to the server
    status: RolloutStatus = RolloutStatus.PENDING
    rollout_logprobs: list[float] = field(default_factory=list)  # server's log p of each output token
    finish_reason: dict | None = None
    response: str = ""
    reward: float | None = None
    error: str | None = None
    attempts: int = 0
    submitted_at: float | None = None  # time.monotonic()
    first_token_at: float | None = None
    finished_at: float | None = None

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
        self.read_meta(meta)
        ends = {"stop": RolloutStatus.FINISHED, "length": RolloutStatus.TRUNCATED}
        self.status = ends.get((self.finish_reason or {}).get("type"), RolloutStatus.ABORTED)
        if self.status is RolloutStatus.ABORTED:
            self.error = str((self.finish_reason or {}).get("message", "no finish reason"))
        if self.done and len(self.rollout_logprobs) != len(self.output_ids):
            self.status = RolloutStatus.FAILED
            self.error = f"{len(self.rollout_logprobs)} logprobs for {len(self.output_ids)} output tokens"


async def run_rollout(
    client: RolloutClient, r: Rollout, params: dict, stream: bool, stream_interval: int = 8, url: str | None = None
) -> Rollout:
    """Submit one rollout (to `url`, else the client's pick) and fill it in. A lost connection marks it aborted
    (to be re-submitted), a refused request failed."""
    r.attempts += 1
    r.submitted_at = time.monotonic()
    sp = dict(params, sampling_seed=r.seed) if r.seed is not None else params  # SGLang's field name
    rid = f"{r.rid}-a{r.attempts}"  # a re-submission must not collide with a lingering old request
    try:
        if stream:
            await _stream(client, r, dict(sp, stream_interval=stream_interval), rid, url)
        else:
            r.apply(await client.generate(r.prompt_ids, sp, rid=rid, url=url))
    except (RolloutServerError, httpx.TransportError) as exc:
        status = exc.status if isinstance(exc, RolloutServerError) else 0
        r.status = RolloutStatus.FAILED if status >= 400 else RolloutStatus.ABORTED
        r.error = str(exc) or type(exc).__name__
    r.finished_at = time.monotonic()
    if r.first_token_at is None and r.output_ids:
        r.first_token_at = r.finished_at
    return r


async def _stream(client: RolloutClient, r: Rollout, sp: dict, rid: str, url: str | None = None) -> None:
    """`stream_interval` in `sp` bounds the O(n^2) bytes of cumulative chunks."""
    ids: list[int] = []
    lps: list = []
    last: dict = {}
    async for chunk in client.generate_stream(r.prompt_ids, sp, rid=rid, url=url):
        meta = chunk.get("meta_info", {})
        n = meta.get("completion_tokens", 0)
        if r.first_token_at is None and n > 0:
            r.first_token_at = time.monotonic()
        # cumulative chunks (SGLang's default) hold all so far, incremental ones (--incremental-streaming-output)
        # must be concatenated: tell them apart per field
        new_ids, new_lps = chunk.get("output_ids") or [], meta.get("output_token_logprobs") or []
        ids = new_ids if len(new_ids) == n else ids + new_ids
        lps = new_lps if len(new_lps) == n else lps + new_lps
        last = chunk
    r.apply(dict(last, output_ids=ids, meta_info=dict(last.get("meta_info", {}), output_token_logprobs=lps)))
