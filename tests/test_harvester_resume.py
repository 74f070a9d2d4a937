"""Resume of the harvester with the trainer checkpoint: the drafter in training (ahead of the
serving one), its optimizer and RNG come back from the step checkpoint, so training continues
exactly as without the crash; a version written but never pushed is served and pushed again, and
numbers never repeat."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from gleanrl.clients.rollout import FinishedRollout
from gleanrl.harvest import pushing
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.config import HarvestConfig
from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.trainer.checkpoint import load_latest, save_checkpoint


def _params(drafter) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in drafter.state_dict().items()}


def _always_better(monkeypatch, h) -> None:
    """The candidate beats the serving drafter whatever it is, on enough held-out prompts for the
    paired test (harvest.pushing; the gate itself is tested elsewhere)."""
    held = [SimpleNamespace(prompt=i % 4) for i in range(8)]
    monkeypatch.setattr(pushing, "pick_holdout", lambda spool, cfg, policy_version=None: held)
    monkeypatch.setattr(
        pushing,
        "holdout_sums",
        lambda drafter, held, cfg, cache, stop=None: [(1.0 if drafter is h.serving else 2.0, 1)] * len(held),
    )


def test_resume_restores_training_state_and_repushes_the_serving_version(tiny_qwen2, tmp_path, monkeypatch):
    drafter0 = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "drafter0")
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()
    root = tmp_path / "run" / "harvest"
    hooks, serve = HarvestHooks.for_run(str(tiny_qwen2), str(drafter0), root, resume=False)
    assert serve == drafter0
    h = hooks.h
    h.cfg = HarvestConfig(batch_size=2, lr=3e-3, push_every=0, topk=8, max_tokens=16)
    pushed: list[int] = []
    h.push = lambda path, version: pushed.append(version)
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        h.add_rollout(
            torch.randint(3, 90, (5,), generator=gen).tolist(),
            torch.randint(3, 90, (30,), generator=gen).tolist(),
            model,
            policy_version=0,
        )
    h.train_while(lambda: True, max_steps=3)
    _always_better(monkeypatch, h)
    assert h.maybe_push() == 1 and pushed == [1]
    h.train_while(lambda: True, max_steps=2)  # progress after the push, not pushed yet
    hooks.on_step_start(2, model)
    hooks.on_rollout_finished(FinishedRollout([4, 5], [6, 7, 8]))  # carried to the next window
    save_checkpoint(
        tmp_path / "run",
        1,
        model,
        None,
        torch.optim.SGD(model.parameters(), lr=0.1),
        {},
        2,
        hooks_state=hooks.state_dict(),
    )
    trained, steps = _params(h.drafter), h.steps
    # the crash: written, never pushed
    save_drafter(h.drafter, root / "drafter_versions" / "v000002")
    h.train_while(lambda: True, max_steps=1)  # what the run would have done next
    expected = _params(h.drafter)

    resumed = load_latest(tmp_path / "run")
    assert resumed.step == 1 and resumed.hooks_state is not None
    again, serve = HarvestHooks.for_run(str(tiny_qwen2), str(drafter0), root, resume=True)
    again.h.cfg = h.cfg
    again.load_state_dict(resumed.hooks_state)
    assert serve == root / "drafter_versions" / "v000002" and again.h.version == 2
    assert all(torch.equal(v, trained[k]) for k, v in _params(again.h.drafter).items())
    assert again.h.steps == steps and list(again._queue) == [([4, 5], [6, 7, 8])]
    repushed: list[tuple[str, int]] = []
    again.h.push = lambda path, version: repushed.append((path, version))
    again.bind_push(lambda path, version: pytest.fail("the Harvester's own push is kept"))
    again.bind_push(lambda path, version: pytest.fail("the Harvester's own push is kept"))
    assert repushed == [(str(serve), 2)]  # once, right after the resume
    # same batch, same optimizer moments: same weights
    again.h.train_while(lambda: True, max_steps=1)
    assert all(torch.allclose(v, expected[k], atol=1e-6) for k, v in _params(again.h.drafter).items())
    _always_better(monkeypatch, again.h)
    assert again.h.maybe_push() == 3 and repushed[-1][1] == 3  # 2 is never reused


def test_refused_push_leaves_no_version_behind(tiny_qwen2, tmp_path, monkeypatch):
    drafter0 = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "drafter0")
    hooks, _ = HarvestHooks.for_run(str(tiny_qwen2), str(drafter0), tmp_path / "harvest", resume=False)

    def refuse(path, version):
        raise RuntimeError("no")

    hooks.h.push = refuse
    _always_better(monkeypatch, hooks.h)
    with pytest.raises(RuntimeError, match="no"):
        hooks.h.maybe_push()
    assert not any((tmp_path / "harvest" / "drafter_versions").glob("v*")) and hooks.h.version == 0
    resumed, serve = HarvestHooks.for_run(str(tiny_qwen2), str(drafter0), tmp_path / "harvest", resume=False)
    assert serve == drafter0 and resumed.h.version == 0
