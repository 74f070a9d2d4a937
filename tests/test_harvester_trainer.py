"""The Harvester inside gleanrl's GRPO loop through its hooks, against a real server with a drafter:
finished rollouts are captured by the trainer's policy at their version, the drafter trains in the
idle window, pushes are monotonic and reach the server, and every rollout is either
harvested or dropped."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.config import HarvestConfig
from gleanrl.harvest.harvester import Harvester
from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.harvest.spool import SpoolConfig
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.loop import train
from gleanrl.trainer.tasks.base import Task
from tests.serving import running_server


class DigitTask(Task):
    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        return [{"prompt": f"what is {seed % 7 + i} + {i}?"} for i in range(n)]

    def reward(self, sample: dict, response: str) -> float:
        return sum(c.isdigit() for c in response) / max(len(response), 1)


@pytest.fixture(scope="module")
def tail_model(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    """The tiny model with its EOS logit raised: response lengths spread out into a long tail."""
    out = tmp_path_factory.mktemp("tail") / "model"
    shutil.copytree(tiny_qwen2, out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        ids = torch.tensor([tiny_tokenizer("what is 3 + 4? Let us add step by step")["input_ids"]])
        d = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].mean(0)
        model.lm_head.weight[tiny_tokenizer.eos_token_id] += 3.0 * d / d.norm() ** 2
    model.save_pretrained(out)
    return out


def test_grpo_loop_with_harvest_hooks(tail_model, tmp_path):
    save_drafter(init_drafter(tail_model, seed=0), tmp_path / "drafter0")
    with running_server(tail_model, drafter=str(tmp_path / "drafter0"), sd="on") as url:
        # bound to the loop's client
        h = Harvester(
            tail_model,
            tmp_path / "drafter0",
            tmp_path / "spool",
            push=None,
            cfg=HarvestConfig(push_every=4, lr=3e-3, topk=8, spool=SpoolConfig(holdout_every=3)),
        )
        hooks = HarvestHooks(h)
        cfg = TrainConfig(
            model=str(tail_model),
            out=str(tmp_path / "run"),
            servers=[url],
            steps=2,
            prompts_per_step=2,
            samples_per_prompt=4,
            max_new_tokens=64,
            lr=3e-3,
            seed=1,
        )
        row = train(cfg, task=DigitTask(), hooks=hooks, log=lambda *a: None)
        metrics = hooks.step_metrics()
        info = httpx.get(f"{url}/model_info", timeout=30).json()
    assert row["step"] == 2 and row["drafter_version"] == h.version
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the rows' harvest figures are what the hooks did: every capture in one step's row
    assert sum(r["harvested"] for r in rows) == hooks.captured > 0
    assert sum(r["drafter_steps"] for r in rows) == h.steps > 0
    assert all({"idle_used_s", "drafter_version", "heldout_accept_len", "harvest_carried"} <= set(r) for r in rows)
    # captured by step 2's update, for the next window to spool
    pending = metrics["harvest_pending"]
    # none lost, none twice
    assert hooks.captured + hooks.dropped + metrics["harvest_carried"] + pending == 16
    assert hooks.dropped == 0
    assert hooks.captured > 0 and h.idle.steps > 0
    versions = {it.policy_version for it in h.spool._mem.values()}
    assert versions <= {0, 1}
    assert metrics["idle_used_s"] <= metrics["idle_window_s"] and metrics["idle_overrun_s"] >= 0
    pushed = [p["version"] for p in h.history if p["pushed"]]
    assert pushed == list(range(1, h.version + 1))
    if h.version:
        assert info["draft_weight_version"] == str(h.version)
