"""Trainer pieces without a server: tail time, percentiles, metrics log, checkpoints, the record."""

from __future__ import annotations

import json

import pytest
import torch

from gleanrl.clients.rollout import Rollout, RolloutStatus
from gleanrl.trainer.checkpoint import list_checkpoints, load_latest, save_checkpoint
from gleanrl.trainer.metrics import MetricsLog, percentile, tail_seconds


def test_tail_seconds_is_the_time_while_a_quarter_or_less_still_run():
    # 8 requests: after the 6th finish (t=6) 2 <= 8/4 still run; the last finishes at t=20
    assert tail_seconds([1, 2, 3, 4, 5, 6, 7, 20]) == pytest.approx(14.0)
    # 5 requests: after ceil(3.75) = 4 finishes 1 <= 1.25 still runs
    assert tail_seconds([10, 0, 1, 2, 3]) == pytest.approx(7.0)
    assert tail_seconds([]) == 0.0 and tail_seconds([4.0]) == 0.0


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7], 99) == 7 and percentile([], 50) == 0.0


def test_metrics_log_drops_rows_lost_to_a_crash(tmp_path):
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.log({"step": step, "reward_mean": 0.5}, echo=lambda *a: None)
    lines = []
    MetricsLog(tmp_path, resume_step=2).log({"step": 3, "reward_mean": 1.0}, echo=lines.append)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward_mean"]) for r in rows] == [(1, 0.5), (2, 0.5), (3, 1.0)]
    assert lines[0].split()[:3] == ["step", "reward", "acc"] and lines[1].split()[0] == "3"
    MetricsLog(tmp_path)  # a fresh run starts a fresh file
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_checkpoints_keep_last_and_resume_restores_rng(tiny_qwen2, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in (1, 2, 3):
        torch.manual_seed(step)
        save_checkpoint(tmp_path, step, model, None, opt, {"step_cfg": step}, keep_last=2)
        expected = torch.rand(3)  # the first draw after the checkpoint of `step`
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    assert (tmp_path / "weight_v3" / "config.json").is_file()
    assert json.loads((tmp_path / "weight_v3" / "train_config.json").read_text()) == {"step_cfg": 3}
    torch.manual_seed(123)
    resumed = load_latest(tmp_path)
    assert resumed.step == 3 and "state" in resumed.optimizer_state
    assert torch.equal(torch.rand(3), expected)
    assert load_latest(tmp_path / "empty") is None


def test_rollout_record_from_a_native_response():
    r = Rollout(group_id=1, index=0, sample={"prompt": "p"}, prompt_ids=[1, 2])
    assert r.status == RolloutStatus.PENDING and r.prompt == "p"
    r.apply(
        {
            "text": "ab",
            "output_ids": [5, 6],
            "meta_info": {
                "finish_reason": {"type": "stop", "matched": 6},
                "weight_version": 4,
                "draft_weight_version": "2",
                "output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None]],
                "spec_verify_ct": 1,
                "spec_accept_length": 2.0,
            },
        }
    )
    assert (r.status, r.weight_version, r.draft_weight_version, r.rollout_logprobs) == (
        RolloutStatus.FINISHED,
        "4",
        "2",
        [-0.1, -0.2],
    )
    r.apply({"output_ids": [5], "meta_info": {"finish_reason": {"type": "abort", "message": "restart"}}})
    assert r.status == RolloutStatus.ABORTED and r.error == "restart"
    r.apply(
        {
            "output_ids": [5, 6],
            "meta_info": {"finish_reason": {"type": "length", "length": 2}, "output_token_logprobs": [[-0.1, 5, None]]},
        }
    )
    assert r.status == RolloutStatus.FAILED and "logprobs" in r.error
    r.reset()
    assert r.status == RolloutStatus.PENDING and r.output_ids == [] and r.weight_version is None
