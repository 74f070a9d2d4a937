"""Helpers for the CUDA tests: the transformers reference on the test's device."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM


def hf_on(path, device: str, dtype: torch.dtype = torch.float32):
    """The transformers reference, loaded on `device`."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """transformers `generate` on the model's device, greedy, exactly n new tokens (EOS ignored)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids], device=model.device), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
    return out[0, len(ids) :].tolist()
