"""GRPO end to end against a real embedded rollout server on a loopback port, with a tiny policy and
a toy task defined here (rewards with variance inside each group)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch
from safetensors.torch import load_file

from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.generate import encode_prompt
from gleanrl.trainer.hooks import NoHooks
from gleanrl.trainer.loop import train
from gleanrl.trainer.server_proc import EmbeddedServer
from gleanrl.trainer.tasks.base import Task


class ToyTask(Task):
    """Reward: the share of response characters that are digits (a random tiny model emits some)."""

    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        return [{"prompt": f"what is {rng.randint(0, 9)} + {rng.randint(0, 9)}?"} for _ in range(n)]

    def reward(self, sample: dict, response: str) -> float:
        return sum(c.isdigit() for c in response) / max(len(response), 1)


class Crash(RuntimeError):
    pass


class CrashAtStep(NoHooks):
    """Hooks that kill the run in the middle of step `step`'s rollouts (a simulated crash)."""

    def __init__(self, step: int):
        self.step, self.current = step, 0

    def on_step_start(self, step, model):
        self.current = step

    def on_rollout_finished(self, rollout):
        if self.current == self.step:
            raise Crash("simulated crash")

    def idle_window(self):
        import contextlib

        return contextlib.nullcontext()


def _cfg(model, out, **kw) -> TrainConfig:
    base = dict(
        model=str(model),
        out=str(out),
        steps=2,
        prompts_per_step=2,
        samples_per_prompt=3,
        max_new_tokens=8,
        lr=3e-3,
        seed=3,
        keep_last=3,
        server_wait_s=60,
    )
    return TrainConfig(**{**base, **kw})


def _weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def server(tiny_qwen2, tmp_path_factory):
    # one request at a time: a batched forward's last bits depend on what else runs, and the resume
    # test compares weights exactly (the rollout logprobs enter the loss through the ratio)
    srv = EmbeddedServer(
        str(tiny_qwen2),
        threads=1,
        settings={"max_running_requests": 1},
        log_path=tmp_path_factory.mktemp("srv") / "server.log",
    )
    with srv:
        asyncio.run(RolloutClient([srv.url]).wait_healthy(60))
        yield srv


def test_two_steps_change_weights_and_server_version(tiny_qwen2, server, tmp_path):
    out = tmp_path / "run"
    cfg = _cfg(tiny_qwen2, out, servers=[server.url], eval_every=2, eval_prompts=3)
    row = train(cfg, task=ToyTask(), log=lambda *a: None)
    assert row["step"] == 2 and row["weight_version"] == "2"
    initial = load_file(str(next(tiny_qwen2.glob("*.safetensors"))))
    final = _weights(out / "weight_v2")
    assert any(not torch.equal(initial[k], final[k]) for k in initial)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the initial policy's evaluation
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[2] and "eval_accuracy" not in rows[1]
    rows = rows[1:]
    for key in (
        "reward_mean",
        "accuracy",
        "weight_version",
        "response_len_p50",
        "response_len_p99",
        "rollout_s",
        "tail_s",
        "train_s",
        "logprob_mismatch",
    ):
        assert key in rows[0], key
    assert rows[0]["rollout_weight_version"] == "0" and rows[1]["rollout_weight_version"] == "1"
    assert rows[0]["logprob_mismatch"] < 1e-3  # server and trainer compute the same distribution
    assert json.loads((out / "config.resolved.json").read_text())["steps"] == 2

    async def check_server():
        async with RolloutClient([server.url]) as client:
            info = await client.model_info()
            assert info["weight_version"] == "2"
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(tiny_qwen2)
            model = AutoModelForCausalLM.from_pretrained(out / "weight_v2", dtype=torch.float32).eval()
            for text in ("what is 3 + 4?", "hello"):
                ids = encode_prompt(tok, {"prompt": text})
                body = await client.generate(ids, {"max_new_tokens": 8, "temperature": 0})
                with torch.no_grad():
                    ref = model.generate(
                        torch.tensor([ids]),
                        max_new_tokens=8,
                        do_sample=False,
                        eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id,
                    )
                assert body["output_ids"] == ref[0, len(ids) :].tolist()

    asyncio.run(check_server())


def test_resume_after_crash_equals_uninterrupted_run(tiny_qwen2, server, tmp_path):
    quiet = lambda *a: None  # noqa: E731
    train(_cfg(tiny_qwen2, tmp_path / "a", servers=[server.url]), task=ToyTask(), log=quiet)
    crashed = _cfg(tiny_qwen2, tmp_path / "b", servers=[server.url])
    with pytest.raises(Crash):
        train(crashed, task=ToyTask(), hooks=CrashAtStep(2), log=quiet)
    assert (tmp_path / "b" / "weight_v1").is_dir() and not (tmp_path / "b" / "weight_v2").exists()
    with pytest.raises(ValueError, match="--resume"):
        # a fresh run must not mix with old checkpoints
        train(crashed, task=ToyTask(), log=quiet)
    row = train(crashed, task=ToyTask(), resume=True, log=quiet)
    assert row["step"] == 2
    a, b = _weights(tmp_path / "a" / "weight_v2"), _weights(tmp_path / "b" / "weight_v2")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2]
