"""Logprobs of the prompt's own tokens (SGLang's `input_token_logprobs`, `input_top_logprobs`,
`input_token_ids_logprobs` for `logprob_start_len` >= 0), e.g. for slime's on-policy distillation (`max_new_tokens: 0`).

SGLang's shape (`scheduler_components/logprob_result_processor.py`): entries for prompt positions [start, L); entry 0 is
None, entry j >= 1 is log p(ids[start + j] | ids[:start + j]) under the raw logits (no temperature, no penalties). The
top / token-id lists use the same alignment.

With `max_new_tokens` 0 SGLang still scores the position after the prompt: its `output_top_logprobs` (and
`output_token_ids_logprobs`) hold that one row (`next_top`, `next_ids` here); `output_token_logprobs` stays empty.

Computed by a separate forward over the prompt with its own cache, chunked; each chunk's [chunk, V] log-softmax is
reduced to its pairs before the next, so memory stays bounded by the chunk. It reads the runner once, so it sees one set
of weights even across a concurrent update."""

from __future__ import annotations

import torch

from gleanrl.server.sampling.sampler import logprob_extras

CHUNK = 512


@torch.inference_mode()
def input_logprobs(
    runner, ids: list[int], start: int, top_k: int = 0, token_ids: list[int] | None = None
) -> dict[str, list]:
    """Returns {"token": [(lp | None, id)], "top": [pairs | None], "ids": [pairs | None]} for [start, L), and
    "next_top", "next_ids": the pairs at the position after the prompt."""
    length, start = len(ids), min(start, len(ids))
    first = min(start, length - 1)  # the last position is always scored ("next_*")
    cache = runner.new_cache(capacity=length + 1)
    values: list[float] = []  # log p(ids[p + 1]) for p in [first, L - 1)
    extras: list = []  # (top, token-id) pairs for p in [first, L)
    for lo in range(0, length, CHUNK):
        hi = min(lo + CHUNK, length)
        logits, _ = runner.forward(
            torch.tensor(ids[lo:hi], device=runner.device),
            torch.arange(lo, hi, device=runner.device),
            [cache],
            [hi - lo],
            last_only=False,
        )
        if hi <= first:
            continue
        at = max(first, lo)
        lp = torch.log_softmax(logits[at - lo :].float(), dim=-1)  # [hi - at, V]
        nxt = torch.tensor(ids[at + 1 : hi + 1], dtype=torch.long, device=lp.device)  # one short on the last chunk
        values += lp[: len(nxt)].gather(-1, nxt[:, None])[:, 0].tolist()
        extras += logprob_extras(lp, top_k, token_ids)
    top, picked = [t for t, _ in extras], [i for _, i in extras]
    out = {"token": [], "top": [], "ids": [], "next_top": top[-1], "next_ids": picked[-1]}
    if start < length:
        out["token"] = [(None, ids[start])] + list(zip(values, ids[start + 1 :]))
        out["top"] = [None] + top[:-1] if top_k > 0 else []
        out["ids"] = [None] + picked[:-1] if token_ids else []
    return out
