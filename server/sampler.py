"""Sampling as pure tensor functions: processed probabilities, sampling with per-request generators,
and the logprobs returned to clients.

Logprob convention (SGLang 0.5.23's default sampler, `SGLANG_RETURN_ORIGINAL_LOGPROB` unset, read in
`python/sglang/srt/layers/sampler.py` of the installed 0.5.23): the returned logprob of a token is
`log_softmax(logits / temperature)` of the target's logits, with temperature 0 (greedy) read as 1,
taken BEFORE top-k, top-p and min-p (those shape the sampling distribution, not the returned logprob).
Older SGLang renormalised over the top-p nucleus; 0.5.23 does not. The trainer must compute the same.
"""
from __future__ import annotations

import torch

from gleanrl.server.protocol import SamplingParams


def params_tensors(params: list[SamplingParams], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Per-row sampling parameters as tensors [B] (top_k <= 0 means off, stored as 0)."""
    return {
        "temperature": torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        "top_k": torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.long, device=device),
        "top_p": torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        "min_p": torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
    }


def processed_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """logits [B, V]; parameters [B]. Returns the distribution actually sampled from, [B, V]:
    softmax(logits / T) restricted to top-k, then the top-p nucleus, then min-p (relative to the max),
    renormalised. Rows with T == 0 are one-hot on the argmax (greedy), so SD can treat both alike."""
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    probs = torch.softmax(logits.float() / t[:, None], dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)                  # [B, V]
    rank = torch.arange(probs.shape[-1], device=probs.device)[None]
    drop = (top_k[:, None] > 0) & (rank >= top_k[:, None])
    drop |= (sorted_p.cumsum(-1) - sorted_p) > top_p[:, None]              # the top token always stays
    drop |= sorted_p < (min_p * sorted_p[:, 0])[:, None]
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    probs = probs / probs.sum(-1, keepdim=True)
    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def sample(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """probs [B, V] -> token ids [B] (on probs' device). Each row draws from its own CPU generator
    (None: torch's global RNG), so a seeded request samples the same tokens whatever else is in the
    batch, on any device."""
    device, probs = probs.device, probs.cpu()
    out = torch.empty(probs.shape[0], dtype=torch.long)
    for i, g in enumerate(generators):
        if probs[i].max() >= 1.0:  # one-hot (greedy or a collapsed nucleus): no draw, RNG untouched
            out[i] = probs[i].argmax()
        else:
            out[i] = torch.multinomial(probs[i], 1, generator=g)[0]
    return out.to(device)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor,
                   top_p: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V], ids [B] -> log p(ids) [B] with SGLang's convention (module docstring).
    `top_p` is ignored (SGLang's returned logprob is taken before top-p); kept for existing callers."""
    t = torch.where(temperature <= 0, torch.ones_like(temperature), temperature)
    logprobs = torch.log_softmax(logits.float() / t[:, None], dim=-1).gather(-1, ids[:, None])[:, 0]
    return logprobs.clamp(min=torch.finfo(logprobs.dtype).min)
