"""Harvester end to end on a tiny target: harvesting raises the drafter's held-out acceptance,
pushes are gated on beating the serving drafter, versions are monotonic, and a new
Harvester resumes."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from gleanrl.harvest.checkpoint import load_drafter, save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.config import HarvestConfig
from gleanrl.harvest.harvester import Harvester
from gleanrl.harvest.pushing import pick_holdout
from gleanrl.harvest.spool import SpoolConfig


@pytest.fixture(scope="module")
def setup(tiny_qwen2, tmp_path_factory):
    root = tmp_path_factory.mktemp("harvest")
    save_drafter(init_drafter(tiny_qwen2, seed=0), root / "init_drafter")
    target = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    rollouts = []
    for _ in range(64):
        prompt = torch.randint(3, target.config.vocab_size, (6,), generator=gen)
        out = target.generate(
            prompt[None],
            attention_mask=torch.ones(1, 6, dtype=torch.long),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        rollouts.append((prompt.tolist(), out[0, 6:].tolist()))
    return root, target, rollouts


def _cfg(**kw) -> HarvestConfig:
    # greedy rollouts
    return HarvestConfig(
        **{
            "batch_size": 4,
            "lr": 3e-3,
            "push_every": 0,
            "topk": 8,
            "accept_mode": "greedy",
            "spool": SpoolConfig(holdout_every=4),
        }
        | kw
    )


def test_acceptance_rises_push_gated_versions_monotonic_and_resume(setup, tmp_path):
    root, target, rollouts = setup
    pushed: list[tuple[str, int]] = []
    h = Harvester(
        target, root / "init_drafter", tmp_path / "spool", push=lambda p, v: pushed.append((p, v)), cfg=_cfg()
    )
    assert h.maybe_push() is None and h.score() is None  # nothing harvested: nothing to judge
    for prompt, out in rollouts:
        h.add_rollout(prompt, out, target, policy_version=0)
    before = h.score()
    report = h.train_while(lambda: True, max_steps=50)
    after = h.score()
    assert report.steps == 50 and h.steps == 50
    assert after > before + 0.25, (before, after)
    assert h.maybe_push() == 1 and [v for _, v in pushed] == [1]
    assert h.history[-1]["candidate"] == pytest.approx(after)
    assert h.maybe_push() is None  # the serving drafter is now this one: no gain, no push
    pushed_drafter = load_drafter(pushed[0][0])
    assert acceptance_ok(h, pushed_drafter, after)

    h.train_while(lambda: True, max_steps=20)
    v = h.maybe_push()
    assert v in (None, 2) and [v for _, v in pushed] == sorted({v for _, v in pushed})

    resumed = Harvester(target, root / "init_drafter", tmp_path / "spool", push=None, cfg=_cfg())
    assert resumed.version == h.version and len(resumed.spool) == len(h.spool) == 64
    assert resumed.score() == pytest.approx(h.score(h.serving))


def acceptance_ok(h: Harvester, drafter, expected: float) -> bool:
    return h.score(drafter) == pytest.approx(expected)


def test_refused_push_keeps_serving_version(setup, tmp_path):
    root, target, rollouts = setup

    def refuse(path, version):
        raise RuntimeError("server says no")

    # no margin, no confidence: every attempt that gains pushes at once, and is refused
    h = Harvester(
        target,
        root / "init_drafter",
        tmp_path / "spool",
        push=refuse,
        cfg=_cfg(min_gain=0.0, mid_step_gain=0.0, confidence_z=0.0, min_holdout_prompts=2, min_holdout_samples=2),
    )
    for prompt, out in rollouts[:24]:
        h.add_rollout(prompt, out, policy_version=3)
    h.train_while(lambda: True, max_steps=30)
    with pytest.raises(RuntimeError, match="says no"):
        h.maybe_push()
    assert h.version == 0 and h.history == []
    h.cfg.push_every = 5  # inside training, a refused push is recorded and training goes on
    assert h.train_while(lambda: True, max_steps=20).steps == 20
    assert h.version == 0 and len(h.history) == 4 and not any(p["pushed"] for p in h.history)
    assert any("says no" in p.get("error", "") for p in h.history)


def test_background_window_trains_until_closed(setup, tmp_path):
    root, target, rollouts = setup
    h = Harvester(target, root / "init_drafter", None, cfg=_cfg())
    for prompt, out in rollouts[:6]:
        h.add_rollout(prompt, out, target, policy_version=0)
    three = threading.Event()
    seen = []

    def extra() -> bool:
        seen.append(h.steps)
        if h.steps >= 3:
            three.set()
        return False

    window = h.idle_window(extra).open()
    assert three.wait(60)
    report = window.close()
    assert report.steps == h.steps >= 3 and h.idle.steps == report.steps
    steps = h.steps
    assert h.steps == steps and not window._thread.is_alive()


def test_clear_errors_for_bad_inputs(setup, tmp_path):
    root, target, _ = setup
    with pytest.raises(ValueError, match="not a model directory"):
        Harvester(tmp_path / "nope", root / "init_drafter", None)
    with pytest.raises(ValueError, match="does not exist"):
        Harvester(target, tmp_path / "no_drafter", None)
    with pytest.raises(ValueError, match="batch_size"):
        HarvestConfig(batch_size=0)
    with pytest.raises(TypeError, match="DrafterPush"):
        # a URL is the clients' business, not harvest's
        Harvester(target, root / "init_drafter", None, push="http://127.0.0.1:30000")


def test_push_attempt_abandoned_when_the_window_closes(setup, tmp_path):
    root, target, rollouts = setup
    pushed: list[int] = []
    h = Harvester(
        target,
        root / "init_drafter",
        None,
        push=lambda p, v: pushed.append(v),
        cfg=_cfg(confidence_z=0.0, min_holdout_prompts=2, min_holdout_samples=2),
    )
    for prompt, out in rollouts[:16]:
        h.add_rollout(prompt, out, target)
    h.train_while(lambda: True, max_steps=30)
    calls = []
    # closed while scoring
    assert h.maybe_push(stop=lambda: calls.append(1) or len(calls) > 1) is None
    assert h.history == [] and h.version == 0 and pushed == []
    assert h.maybe_push(stop=lambda: False) == 1 and pushed == [1]
    h.cfg.push_every = 1
    # a micro-step that ends as the window closes starts no attempt and keeps it due
    h._closing.set()
    h.train_micro_step()
    assert len(h.history) == 1 and h._since_push >= 1


def _grouped(setup, prompts: int, group: int):
    """GRPO-shaped rollouts: `group` identical greedy samples of each prompt."""
    _, _, rollouts = setup
    return [r for r in rollouts[:prompts] for _ in range(group)]


def test_holdout_is_by_prompt_so_siblings_of_trained_samples_are_never_scored(setup, tmp_path):
    root, target, _ = setup
    h = Harvester(target, root / "init_drafter", None, cfg=_cfg())
    for prompt, out in _grouped(setup, 32, 4):
        h.add_rollout(prompt, out, target)
    items = list(h.spool._mem.values())
    held = {it.prompt for it in items if it.holdout}
    trained = {it.prompt for it in items if not it.holdout}
    assert held and trained and not held & trained
    # every sample of a held-out prompt is held out: whole groups
    assert all(sum(it.prompt == key for it in items) == 4 for key in held)


def test_one_push_a_step_and_a_mid_step_winner_waits_for_the_boundary(setup, tmp_path):
    root, target, rollouts = setup
    pushed: list[int] = []
    # its own versions_dir: the module's root holds the versions earlier tests pushed
    cfg = _cfg(
        push_every=5,
        min_holdout_prompts=2,
        min_holdout_samples=2,
        mid_step_gain=100.0,
        versions_dir=str(tmp_path / "drafter_versions"),
    )
    h = Harvester(target, root / "init_drafter", None, push=lambda p, v: pushed.append(v), cfg=cfg)
    for prompt, out in rollouts:
        h.add_rollout(prompt, out, target)
    h.train_while(lambda: True, max_steps=40)  # inside a step: winners below the margin wait
    waiting = [a for a in h.history if a.get("pending")]
    assert pushed == [] and waiting and all(a["gain_lower"] > cfg.min_gain for a in waiting)
    assert h.new_step() == 1 and pushed == [1]  # the boundary pushes the best of them
    assert h.history[-1]["when"] == "boundary" and h.history[-1]["pushed"]
    assert h.new_step() is None  # nothing waits any more

    # any gain now pushes at once, but once a step: 12 attempts, one push
    h.cfg.mid_step_gain = h.cfg.min_gain = h.cfg.confidence_z = 0.0
    attempts = len(h.history)
    h.train_while(lambda: True, max_steps=60)
    assert pushed == [1, 2]
    after = h.history[attempts:]
    assert [a["version"] for a in after if a.get("pushed")] == [2] and after[-1]["pushed"]


def test_no_push_without_a_significant_paired_gain(setup, tmp_path):
    root, target, _ = setup
    pushed: list[int] = []
    h = Harvester(
        target,
        root / "init_drafter",
        None,
        push=lambda p, v: pushed.append(v),
        cfg=_cfg(min_holdout_prompts=2, min_holdout_samples=2),
    )
    for prompt, out in _grouped(setup, 48, 2):
        h.add_rollout(prompt, out, target)
    with torch.no_grad():  # a candidate that differs from the serving drafter by noise alone
        for p in h.drafter.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 1e-4)
    assert h.maybe_push() is None and pushed == []
    row = h.history[-1]
    assert not row["pushed"] and row["gain_lower"] <= h.cfg.min_gain
    assert row["prompts"] == len({it.prompt for it in pick_holdout(h.spool, h.cfg)})
    # too few held-out prompts: no push, however large the gain
    h.cfg.min_holdout_prompts = row["prompts"] + 1
    h.train_while(lambda: True, max_steps=50)
    assert h.maybe_push() is None and pushed == []


def test_a_mid_step_push_drops_the_candidate_waiting_for_the_boundary(setup, tmp_path):
    """A candidate that won below the mid-step margin waits; a larger win pushed mid-step replaces
    the serving drafter it was scored against, so the boundary must not push the stale one."""
    root, target, rollouts = setup
    pushed: list[int] = []
    cfg = _cfg(
        push_every=0, min_holdout_prompts=2, min_holdout_samples=2, versions_dir=str(tmp_path / "drafter_versions")
    )
    h = Harvester(target, root / "init_drafter", None, push=lambda p, v: pushed.append(v), cfg=cfg)
    for prompt, out in rollouts:
        h.add_rollout(prompt, out, target)
    for _ in range(40):
        h.train_micro_step()
    h.cfg.min_gain = h.cfg.confidence_z = 0.0
    h.cfg.mid_step_gain = 100.0
    assert h.maybe_push(boundary=False) is None and h._pending is not None
    assert h.push_status(h.history[-1]).startswith("won, waits for the step boundary: gain +")
    h.cfg.mid_step_gain = 0.0
    assert h.maybe_push(boundary=False) == 1 and pushed == [1] and h._pending is None
    assert h.push_status(h.history[-1]).startswith("pushed v1: gain +")
    assert h.new_step() is None and pushed == [1]
