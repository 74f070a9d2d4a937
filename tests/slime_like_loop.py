"""An RL loop that is not gleanrl's: written from slime's HTTP calls to SGLang (`/generate` with
`input_ids` and `return_logprob`, one request per sample; weight sync as pause -> flush ->
update_weights_from_disk with `weight_version` -> continue). It knows nothing of gleanrl: only
httpx, torch and transformers (tests/test_harvest_sidecar.py checks its imports). REINFORCE with a
group-mean baseline on a toy reward."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def reward(text: str) -> float:
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def generate(url: str, ids: list[int], max_new_tokens: int, headers: dict) -> dict:
    body = {
        "input_ids": ids,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0, "top_p": 1.0},
    }
    resp = httpx.post(f"{url}/generate", json=body, headers=headers, timeout=300)
    resp.raise_for_status()
    return resp.json()


def update_weights(url: str, path: Path, version: int, headers: dict) -> None:
    for route, body in (
        ("/pause_generation", {}),
        ("/flush_cache", None),
        ("/update_weights_from_disk", {"model_path": str(path), "weight_version": str(version)}),
        ("/continue_generation", {}),
    ):
        resp = httpx.post(f"{url}{route}", json=body, headers=headers, timeout=300)
        resp.raise_for_status()


def train(
    url: str,
    policy: Path,
    out: Path,
    steps: int,
    prompts: int = 2,
    samples: int = 4,
    max_new_tokens: int = 48,
    headers: dict | None = None,
    lr: float = 1e-3,
    on_step=None,
) -> list[list[dict]]:
    """Returns every step's responses (SGLang's /generate JSON, with meta_info)."""
    headers = headers or {}
    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    history = []
    with ThreadPoolExecutor(max_workers=prompts * samples) as pool:
        for step in range(steps):
            batch = [tok.encode(f"count from {step + i}:") for i in range(prompts) for _ in range(samples)]
            outs = list(pool.map(lambda ids: generate(url, ids, max_new_tokens, headers), batch))
            rewards = torch.tensor([reward(o["text"]) for o in outs]).view(prompts, samples)
            adv = (rewards - rewards.mean(dim=1, keepdim=True)).flatten()
            opt.zero_grad()
            for ids, o, a in zip(batch, outs, adv.tolist()):
                seq = torch.tensor([ids + o["output_ids"]])
                logp = torch.log_softmax(model(seq).logits[0, :-1], -1).gather(1, seq[0, 1:, None])[:, 0]
                (-(a * logp[len(ids) - 1 :].sum()) / len(outs)).backward()
            opt.step()
            ckpt = out / f"step_{step + 1}"
            model.save_pretrained(ckpt, safe_serialization=True)
            tok.save_pretrained(ckpt)
            update_weights(url, ckpt, step + 1, headers)
            history.append(outs)
            if on_step is not None and on_step(step, outs) is False:
                break
    return history
