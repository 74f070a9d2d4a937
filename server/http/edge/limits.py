"""What one request may cost, checked before any work (docs/reliability.md lists each limit); tokenizing
off the event loop."""

from __future__ import annotations

import asyncio

from gleanrl.server.http.edge.errors import ApiError, bad_field

RETRY_AFTER_S = 1


def check_batch(state, count: int, field: str) -> None:
    """One HTTP request may start at most `max_batch` engine requests (prompts x n)."""
    limit = state.server_cfg.max_batch
    if count > limit:
        raise bad_field(field, f"{count} sequences (prompts x n) in one request; the limit is {limit}")


def check_serving(state) -> None:
    """For the generation routes: a 400 while any memory is released."""
    if released := state.engine.released_memory():
        raise ApiError(
            400, f"memory is released (tags {sorted(released)}); call /resume_memory_occupation before generating"
        )


def check_queue(state, count: int) -> None:
    """503 with Retry-After when `count` more requests would overfill the queue (SGLang's answer)."""
    limit = state.server_cfg.max_queued_requests
    queued = state.engine.stats().get("num_queue_reqs") or 0
    if queued + count > limit:
        raise ApiError(
            503,
            f"The request queue is full: {queued} requests wait and this one adds {count} (limit {limit}); retry later",
            kind="server_overloaded",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


def check_token_ids(state, ids: list[int] | None, field: str) -> None:
    """`token_ids_logprob`: at most `max_token_ids_logprob` ids, each inside the vocabulary."""
    if ids is None:
        return
    limit = state.server_cfg.max_token_ids_logprob
    if len(ids) > limit:
        raise bad_field(field, f"{len(ids)} ids, over the limit of {limit}")
    check_vocab(state, ids, field)


def check_vocab(state, ids: list[int], field: str) -> None:
    bad = next((t for t in ids if not 0 <= t < state.vocab_size), None)
    if bad is not None:
        raise bad_field(field, f"token id {bad} is outside the vocabulary [0, {state.vocab_size})")


def check_top_logprobs(state, k: int, field: str) -> None:
    limit = state.server_cfg.max_top_logprobs_num
    if not 0 <= k <= limit:
        raise ApiError(400, f"{field} must be in [0, {limit}], got {k}", param=field)


def check_logprob_volume(state, reqs) -> None:
    """The (logprob, id) pairs one HTTP request's logprob options would hold."""
    total = sum(
        (r.top_logprobs_num + len(r.token_ids_logprob or ()))
        * ((len(r.input_ids) - r.logprob_start_len if r.logprob_start_len >= 0 else 0) + r.params.max_new_tokens)
        for r in reqs
        if r.return_logprob
    )
    limit = state.server_cfg.max_logprob_pairs
    if total > limit:
        raise bad_field(
            "top_logprobs_num",
            f"the logprobs asked for would hold {total} (logprob, id) pairs (positions x (top_logprobs_num + "
            f"len(token_ids_logprob))), over the limit of {limit}",
        )


async def encode(state, texts: list[str], **kwargs) -> list[list[int]]:
    """Token ids of each text, in a worker thread (a large body must not block the event loop)."""
    tok = state.tokenizer
    return await asyncio.to_thread(lambda: [tok.encode(t, **kwargs) for t in texts])
