"""A small end-to-end run: GRPO on a tiny policy against a real server serving a drafter with SD,
the Harvester training in each step's idle window. The drafter's expected acceptance on held-out
harvested rollouts rises over the drafter it started from, better versions are pushed mid-run and
served, and training continued from the serving weights."""

from __future__ import annotations

import httpx
import torch

from gleanrl.harvest.checkpoint import load_drafter, save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.config import HarvestConfig
from gleanrl.harvest.harvester import Harvester
from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.harvest.spool import SpoolConfig
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.loop import train
from gleanrl.trainer.tasks.base import Task
from tests.serving import running_server


class CountTask(Task):
    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        return [{"prompt": f"count from {seed % 5 + i}:"} for i in range(n)]

    def reward(self, sample: dict, response: str) -> float:
        return sum(c.isdigit() for c in response) / max(len(response), 1)


def test_online_drafter_beats_its_start_and_is_pushed(tiny_qwen2, tmp_path):
    torch.set_num_threads(1)
    save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "drafter0")
    with running_server(tiny_qwen2, drafter=str(tmp_path / "drafter0"), sd="on") as url:
        h = Harvester(
            tiny_qwen2,
            tmp_path / "drafter0",
            tmp_path / "spool",
            push=None,
            # held out by prompt (harvest.pushing): half of the run's few prompts,
            # a paired test over as few as 2 of them; a winner inside a step is pushed
            # at the next step's start, so the run has a step after the first win
            cfg=HarvestConfig(
                push_every=3,
                lr=3e-3,
                topk=16,
                max_tokens=48,
                max_holdout=8,
                min_holdout_prompts=2,
                min_holdout_samples=4,
                spool=SpoolConfig(holdout_every=2),
            ),
        )
        rl = dict(model=str(tiny_qwen2), out=str(tmp_path / "run"), servers=[url], prompts_per_step=2)
        rl |= dict(samples_per_prompt=4, max_new_tokens=96, lr=1e-3, seed=0)
        # 4 steps, resumed 2 at a time until a push (at most 10): a loaded machine trains the drafter less per
        # idle window, and the gate pushes only a significant win
        for steps in (4, 6, 8, 10):
            train(TrainConfig(**rl, steps=steps), CountTask(), HarvestHooks(h), log=lambda *a: None, resume=steps > 4)
            if h.version >= 1:
                break
        info = httpx.get(f"{url}/model_info", timeout=30).json()
    assert h.steps >= 6, f"only {h.steps} drafter micro-steps in the idle windows"
    start = load_drafter(tmp_path / "drafter0")
    before, after = h.score(start), h.score(h.drafter)
    assert after > before + 0.02, (before, after)
    pushed = [p for p in h.history if p["pushed"]]
    assert h.version >= 1 and [p["version"] for p in pushed] == list(range(1, h.version + 1)), [
        (a["when"], a.get("prompts"), a.get("samples"), a.get("gain_lower"), a.get("pending")) for a in h.history
    ]
    assert all(p["candidate"] > p["serving"] for p in pushed)
    assert info["draft_weight_version"] == str(h.version)
