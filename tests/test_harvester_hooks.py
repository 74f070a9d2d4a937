"""HarvestHooks without a server: captures happen in the idle window at the capturing policy's
version (mid-step while the spool is cold), the tail carries over to the next window, a bad rollout
is skipped, the queue is bounded, and the step's figures add up."""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM

from gleanrl.clients.rollout import FinishedRollout
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.config import HarvestConfig
from gleanrl.harvest.harvester import Harvester
from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.harvest.spool import SpoolConfig


def _rollout(prompt, output, version="0", verify_ct=0, accepted=0):
    return FinishedRollout(
        prompt, output, weight_version=version, spec_verify_ct=verify_ct, spec_accept_token_num=accepted
    )


def test_hooks_capture_drop_skip_and_metrics(tiny_qwen2, tmp_path, capsys):
    save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "d0")
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()
    cfg = HarvestConfig(push_every=0, spool=SpoolConfig(holdout_every=0))
    h = Harvester(tiny_qwen2, tmp_path / "d0", None, cfg=cfg)
    hooks = HarvestHooks(h)
    hooks.on_step_start(1, model)
    vocab = model.config.vocab_size
    # 3 of 4 tokens by SD
    hooks.on_rollout_finished(_rollout([5, 6, 7], [8, 9, 10, 11], verify_ct=2, accepted=1))
    hooks.on_rollout_finished(_rollout([5, 6], [vocab + 5, 3]))  # an id the policy cannot embed
    # no version: the step's
    hooks.on_rollout_finished(_rollout([7], [12, 13, 14, 15], version=None))
    with hooks.idle_window():
        deadline = time.monotonic() + 30
        while (hooks.captured + hooks.errors < 3 or h.steps < 2) and time.monotonic() < deadline:
            time.sleep(0.01)
    m = hooks.step_metrics()
    assert (hooks.captured, hooks.errors, m["harvested"], m["harvest_errors"]) == (2, 1, 2, 1)
    assert "harvest skipped a rollout" in capsys.readouterr().err
    assert {it.policy_version for it in h.spool._mem.values()} == {0}
    assert m["sd_token_share"] == 3 / 10 and m["drafter_steps"] == h.steps >= 2
    assert m["idle_used_s"] <= m["idle_window_s"]

    # the tail: finishes as the window closes
    hooks.on_rollout_finished(_rollout([1, 2], [3, 4, 5]))
    # an update without update_capture(): the tail is captured by version 1
    hooks.on_step_start(2, model)
    assert hooks.step_metrics()["harvest_carried"] == 1
    with hooks.idle_window():
        deadline = time.monotonic() + 30
        while hooks.captured < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    m = hooks.step_metrics()
    assert (m["harvested"], m["harvest_carried"], m["harvest_dropped"]) == (1, 0, 0)
    assert [it.policy_version for it in h.spool._mem.values()] == [0, 0, 1]


def test_hooks_queue_is_bounded(tiny_qwen2, tmp_path):
    save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "d0")
    hooks = HarvestHooks(Harvester(tiny_qwen2, tmp_path / "d0", None), max_queue=3)
    hooks.on_step_start(1, None)
    for i in range(5):
        hooks.on_rollout_finished(_rollout([1], [2 + i]))
    with hooks.update_capture():  # an update that takes none of them: all five go to the idle queue
        pass
    m = hooks.step_metrics()
    assert (m["harvest_carried"], m["harvest_dropped"], hooks.dropped) == (3, 2, 2)
    assert [out for _, out in hooks._queue] == [[4], [5], [6]]  # the oldest went


def test_a_warm_spool_alternates_capture_and_training(tiny_qwen2, tmp_path):
    """Once the spool holds a batch, the idle window no longer spends every micro-step on capture
    forwards of queued rollouts: every other one trains (at nice 19 capture alone filled
    whole windows)."""
    save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "d0")
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()
    h = Harvester(
        tiny_qwen2,
        tmp_path / "d0",
        None,
        cfg=HarvestConfig(push_every=0, batch_size=2, spool=SpoolConfig(holdout_every=0)),
    )
    hooks = HarvestHooks(h)
    hooks.on_step_start(1, model)
    for i in range(6):
        hooks.on_rollout_finished(_rollout([5, 6], [7 + i, 8, 9, 10]))
    with hooks.update_capture():  # an update that takes none: all six go to the idle queue
        pass
    hooks.on_step_start(2, model)
    done = [hooks._capture_one() for _ in range(6)]
    assert hooks.captured == 4 and len(h.spool) == 4
    # cold spool: capture; warm: every other call
    assert done == [True, True, False, True, False, True]
