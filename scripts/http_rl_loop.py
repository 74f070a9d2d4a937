"""An RL loop that is not gleanrl's, for scripts/measure_sidecar.py: only HTTP to its rollout server, as
slime does (`POST /generate` per sample), a REINFORCE step on its own copy of the policy, saved atomically
and pushed as pause -> flush -> `POST /update_weights_from_disk` with a `weight_version` -> continue."""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gleanrl.base.atomic import atomic_dir
from gleanrl.trainer.tasks.base import Task


def reinforce_step(model, opt, batch: list[tuple[list[int], list[int], float]], group: int) -> float:
    """One policy-gradient step: token-mean log p(response | prompt) x (reward - its prompt group's
    mean reward). Returns the loss."""
    rewards = torch.tensor([r for *_, r in batch]).view(-1, group)
    adv = (rewards - rewards.mean(dim=1, keepdim=True)).flatten().tolist()
    opt.zero_grad()
    total = 0.0
    for (prompt, output, _), a in zip(batch, adv):
        if not output or a == 0.0:
            continue
        seq = torch.tensor([prompt + output])
        logp = torch.log_softmax(model(input_ids=seq).logits[0, :-1].float(), -1)
        tok_logp = logp[len(prompt) - 1 :].gather(1, seq[0, len(prompt) :, None])[:, 0]
        loss = -a * tok_logp.mean() / len(batch)
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return total


class HttpLoop:
    def __init__(
        self, url: str, admin_api_key: str, policy: str, lr: float, max_new_tokens: int, out: Path, task: Task
    ):
        self.url, self.out, self.max_new_tokens, self.task = url, out, max_new_tokens, task
        self.client = httpx.Client(timeout=3600, headers={"Authorization": f"Bearer {admin_api_key}"})
        self.tok = AutoTokenizer.from_pretrained(policy)
        self.model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)

    def get(self, route: str) -> dict:
        return self.client.get(f"{self.url}{route}").json()

    def generate(self, ids: list[int]) -> dict:
        sampling = {"max_new_tokens": self.max_new_tokens, "temperature": 1.0, "top_p": 1.0}
        body = {"input_ids": ids, "return_logprob": True, "sampling_params": sampling}
        resp = self.client.post(f"{self.url}/generate", json=body)
        resp.raise_for_status()
        return resp.json()

    def rollouts(self, samples: list[dict], group: int, pool: Executor) -> tuple[list, list[dict]]:
        """`group` samples of each prompt, all at once: ([(prompt_ids, output_ids, reward)], meta_infos)."""
        prompts = [list(s["prompt_ids"]) if "prompt_ids" in s else self.tok.encode(s["prompt"]) for s in samples]
        batch_ids = [p for p in prompts for _ in range(group)]
        outs = list(pool.map(self.generate, batch_ids))
        texts = [self.tok.decode(o["output_ids"], skip_special_tokens=True) for o in outs]
        rewards = [self.task.reward(samples[i // group], text) for i, text in enumerate(texts)]
        batch = [(p, o["output_ids"], r) for p, o, r in zip(batch_ids, outs, rewards)]
        return batch, [o["meta_info"] for o in outs]

    def update(self, batch: list[tuple[list[int], list[int], float]], group: int, version: int) -> float:
        """One REINFORCE step, saved atomically as OUT/policy_v{version} and pushed; the loss."""
        self.model.train()
        loss = reinforce_step(self.model, self.opt, batch, group)
        ckpt = self.out / f"policy_v{version}"
        with atomic_dir(ckpt) as tmp:  # the server never reads half a checkpoint
            self.model.save_pretrained(tmp, safe_serialization=True)
            self.tok.save_pretrained(tmp)
        for route, body in (
            ("/pause_generation", {}),
            ("/flush_cache", None),
            ("/update_weights_from_disk", {"model_path": str(ckpt), "weight_version": str(version)}),
            ("/continue_generation", {}),
        ):
            self.client.post(f"{self.url}{route}", json=body).raise_for_status()
        return loss
