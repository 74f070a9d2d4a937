"""Hidden states from the policy update's own forward: equal to a separate capture pass on the same
rollouts, only for the rollouts the harvester wants, in the spool's dtype; the hooks route what the
update skipped to the idle window and spool the rest there, without a second forward."""

from __future__ import annotations

import time

import pytest
import torch

from gleanrl.clients.rollout import Rollout, RolloutStatus
from gleanrl.harvest.capture import UpdateCapture, capture, decoder_layers
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.config import HarvestConfig
from gleanrl.harvest.harvester import Harvester
from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.policy import Policy


def _rollouts() -> list[Rollout]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (p, o, reward) in enumerate([(4, 9, 1.0), (6, 3, 0.0), (3, 12, 0.0), (5, 7, 1.0)]):
        prompt = torch.randint(5, 300, (p,), generator=g).tolist()
        r = Rollout(
            group_id=i // 2, index=i % 2, sample={}, prompt_ids=prompt, status=RolloutStatus.FINISHED, reward=reward
        )
        r.output_ids = torch.randint(5, 300, (o,), generator=g).tolist()
        r.rollout_logprobs = [-1.0] * o
        out.append(r)
    return out


@pytest.mark.parametrize("aux_dtype", [torch.float32, torch.bfloat16])
def test_update_forward_equals_a_capture_pass(tiny_qwen2, tmp_path, aux_dtype):
    policy = Policy(TrainConfig(model=str(tiny_qwen2), out=str(tmp_path), micro_batch_size=3), str(tiny_qwen2))
    rollouts, layer_ids = _rollouts(), [0, 1, 2]
    skipped = rollouts[1]
    want = capture(
        policy.model,
        [r.prompt_ids + r.output_ids for r in rollouts],
        layer_ids,
        topk=8,
        prompt_lens=[len(r.prompt_ids) for r in rollouts],
        policy_version=4,
        aux_dtype=aux_dtype,
    )
    got: dict[int, object] = {}
    cap = UpdateCapture(
        layer_ids,
        8,
        aux_dtype,
        4,
        wants=lambda r: r is not skipped,
        put=lambda r, s: got.setdefault(rollouts.index(r), s),
    )
    before = [p.detach().clone() for p in policy.model.parameters()]
    stats = policy.train_step(rollouts, capture=cap)
    # it did update
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    # two micro-batches, padded
    assert sorted(got) == [0, 2, 3] and stats["update_capture_s"] > 0
    for i, s in got.items():
        ref = want[i]
        assert s.aux_hidden.dtype == aux_dtype and s.aux_hidden.shape == ref.aux_hidden.shape
        torch.testing.assert_close(s.aux_hidden.float(), ref.aux_hidden.float(), atol=1e-5, rtol=1e-4)
        assert torch.equal(s.input_ids, ref.input_ids) and torch.equal(s.loss_mask, ref.loss_mask)
        assert torch.equal(s.topk_ids, ref.topk_ids) and s.policy_version == 4
        torch.testing.assert_close(s.topk_probs, ref.topk_probs, atol=1e-5, rtol=1e-4)
    assert all(not layer._forward_pre_hooks for layer in decoder_layers(policy.model))  # hooks gone


def test_hooks_take_the_update_states_and_queue_the_rest(tiny_qwen2, tmp_path):
    save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "d0")
    cfg = HarvestConfig(push_every=0, batch_size=1, aux_dtype="bfloat16")
    h = Harvester(tiny_qwen2, tmp_path / "d0", None, cfg=cfg)
    hooks = HarvestHooks(h)
    policy = Policy(TrainConfig(model=str(tiny_qwen2), out=str(tmp_path / "run")), str(tiny_qwen2))
    rollouts = _rollouts()
    hooks.on_step_start(3, policy.model)
    for r in rollouts:
        hooks.on_rollout_finished(r)
    with hooks.update_capture() as cap:
        # the update skips the last one (say, zero advantage)
        policy.train_step(rollouts[:3], capture=cap)
    m = hooks.step_metrics()
    assert (m["update_captured"], m["harvest_carried"]) == (3, 1)
    assert len(hooks.state_dict()["queue"]) == 4  # a resume recaptures what was not spooled yet
    hooks.on_step_start(4, policy.model)
    with hooks.idle_window():
        deadline = time.monotonic() + 30
        while hooks.captured < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        # step 4's finisher: left for step 4's update, not captured now
        hooks.on_rollout_finished(rollouts[0])
        # two micro-steps after it arrived: chances the window had to take it
        steps0, deadline = h.steps, time.monotonic() + 30
        while h.steps < steps0 + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert hooks.captured == 4 and len(hooks._fresh) == 1
    items = sorted(h.spool._mem.values(), key=lambda it: it.seq)
    # sampled by v2, the skipped one by v3
    assert [it.policy_version for it in items] == [2, 2, 2, 3]
    assert items[0].tensors["aux_hidden"].dtype == torch.bfloat16
    assert hooks.step_metrics()["harvest_carried"] == 0


def test_mid_step_capture_leaves_the_update_nothing_to_take(tiny_qwen2, tmp_path):
    save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "d0")
    h = Harvester(tiny_qwen2, tmp_path / "d0", None, cfg=HarvestConfig(push_every=0, mid_step_capture=True))
    hooks = HarvestHooks(h)
    policy = Policy(TrainConfig(model=str(tiny_qwen2), out=str(tmp_path / "run")), str(tiny_qwen2))
    rollouts = _rollouts()
    hooks.on_step_start(1, policy.model)
    with hooks.idle_window():
        for r in rollouts[:2]:
            hooks.on_rollout_finished(r)
        deadline = time.monotonic() + 30
        while hooks.captured < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    with hooks.update_capture() as cap:
        policy.train_step(rollouts[:2], capture=cap)
    assert hooks.update_captured == 0 and hooks.captured == 2 and len(h.spool) == 2


def test_an_update_without_advantage_skips_the_forward_not_the_step(tiny_qwen2, tmp_path):
    """No informative group: the optimizer steps on zero gradients, exactly like a full update over
    all-zero advantages (AdamW's momentum still moves the weights), but without
    running the policy."""
    policies = [
        Policy(TrainConfig(model=str(tiny_qwen2), out=str(tmp_path / f"p{i}")), str(tiny_qwen2)) for i in range(2)
    ]
    rollouts = _rollouts()
    for p in policies:
        p.train_step(rollouts)  # an informative step first: momentum to carry on with
    flat = [r for r in _rollouts() if r.group_id == 0]
    for r in flat:
        r.reward = 1.0  # one group, every reward equal: advantage 0 everywhere
    policies[0].train_step(flat)
    forwards = []
    policies[1].model.register_forward_hook(lambda *a: forwards.append(1))
    before = [q.detach().clone() for q in policies[1].model.parameters()]
    stats = policies[1].train_step([])
    assert forwards == [] and stats["train_tokens"] == 0 and stats["grad_norm"] == 0.0
    # momentum moved
    assert any(not torch.equal(a, b) for a, b in zip(before, policies[1].model.parameters()))
    for a, b in zip(policies[0].model.parameters(), policies[1].model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
