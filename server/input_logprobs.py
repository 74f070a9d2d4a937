"""Logprobs of the prompt's own tokens (SGLang's `input_token_logprobs`, `input_top_logprobs`,
`input_token_ids_logprobs` for `logprob_start_len` >= 0), e.g. slime's on-policy distillation, which
sends `max_new_tokens: 0` and reads them.

SGLang's shape (`scheduler_components/logprob_result_processor.py`): entries for prompt positions
[start, L); entry 0 is None, entry j >= 1 is log p(ids[start + j] | ids[:start + j]) under the raw
logits (no temperature, no penalties). The top / token-id lists use the same alignment.

Computed by a separate forward over the prompt with its own cache, chunked so the [chunk, V] logits stay
bounded; it reads the runner once, so it sees one set of weights even across a concurrent update.
"""
from __future__ import annotations

import torch

from gleanrl.server.sampler import logprob_extras

CHUNK = 512


@torch.inference_mode()
def input_logprobs(runner, ids: list[int], start: int, top_k: int = 0,
                   token_ids: list[int] | None = None) -> dict[str, list]:
    """Returns {"token": [(lp | None, id)], "top": [pairs | None], "ids": [pairs | None]} for [start, L)."""
    length = len(ids)
    if start >= length:
        return {"token": [], "top": [], "ids": []}
    cache = runner.new_cache(capacity=length + 1)
    rows: list[torch.Tensor] = []                       # log_softmax at positions [start, L - 1)
    for lo in range(0, length - 1, CHUNK):
        hi = min(lo + CHUNK, length - 1)
        logits, _ = runner.forward(torch.tensor(ids[lo:hi], device=runner.device),
                                   torch.arange(lo, hi, device=runner.device), [cache], [hi - lo], last_only=False)
        if hi > start:
            rows.append(torch.log_softmax(logits[max(start - lo, 0):].float(), dim=-1))
    lp = torch.cat(rows) if rows else torch.empty(0, runner.vocab_size)              # [L - 1 - start, V]
    nxt = torch.tensor(ids[start + 1:], dtype=torch.long)
    token = [(None, ids[start])] + list(zip(lp.gather(-1, nxt[:, None].to(lp.device))[:, 0].tolist(),
                                            ids[start + 1:]))
    extras = logprob_extras(lp, top_k, token_ids) if len(lp) else []
    return {"token": token, "top": [None] + [t for t, _ in extras] if top_k > 0 else [],
            "ids": [None] + [i for _, i in extras] if token_ids else []}
