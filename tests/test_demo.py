"""`gleanrl demo` end to end at tiny sizes: warm start, embedded server with adaptive SD, GRPO with
harvest, three held-out questions through the openai client, report.md with its plots; the warm-started
drafter is cached."""

from __future__ import annotations

import argparse
import json

import pytest

import gleanrl.cli
from gleanrl import demo_setup
from gleanrl.demo_setup import warm_drafter
from gleanrl.trainer.tasks.presets import regime


def test_demo_runs_and_writes_report(tiny_qwen2, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GLEANRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    argv = [
        "demo",
        "--out",
        str(out),
        "--model",
        str(tiny_qwen2),
        "--steps",
        "2",
        "--prompts-per-step",
        "2",
        "--samples-per-prompt",
        "3",
        "--max-new-tokens",
        "24",
        "--warm-prompts",
        "4",
        "--warm-steps",
        "3",
        "--eval-prompts",
        "3",
        "--eval-every",
        "6",
    ]
    assert gleanrl.cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "\nQ: " in printed and "\nA: " in printed and "warm-started drafter" in printed
    closing = json.loads((out / "demo.json").read_text())["closing"]
    assert len(closing) == 3 and all(set(c) == {"question", "expected", "answer", "correct"} for c in closing)
    assert [int(c["question"].split()[1]) for c in closing] == sorted(
        int(c["question"].split()[1]) for c in closing
    )  # short to long
    assert "Held-out questions, through the OpenAI API" in (out / "report.md").read_text()
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the initial policy's held-out accuracy
    assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 2] and rows[0]["eval_temperature"] == 1.0
    assert all("idle_used_s" in r and "sd_token_share" in r for r in rows[1:])
    report = (out / "report.md").read_text()
    for png in ("accuracy.png", "reward.png", "accept_length.png", "lengths.png", "step_time.png"):
        assert (out / png).stat().st_size > 1000 and f"]({png})" in report
    assert report.count("\n| 1 |") == 1 and report.count("\n| 2 |") == 1 and "Held-out accuracy (3 fixed" in report
    # the same prompts' gain without sampling noise, from the reference solutions' probabilities
    assert "no sampling noise" in printed and "reference solutions' probabilities (the same 3 prompts" in report

    args = json.loads((out / "demo.json").read_text())
    # same settings: from the cache, no training
    cached = warm_drafter(tiny_qwen2, argparse.Namespace(**args))
    assert (cached / "config.json").exists() and "warm-started" not in capsys.readouterr().out


def test_demo_refuses_a_foreign_out_dir(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    assert gleanrl.cli.main(["demo", "--out", str(tmp_path)]) == 2
    assert "not a demo output" in capsys.readouterr().err and (tmp_path / "precious.txt").exists()


def test_from_scratch_bootstraps_and_the_default_is_the_shipped_policy(monkeypatch, tmp_path):
    from gleanrl import demo_setup, shipped
    from gleanrl.trainer import bootstrap

    built = []
    monkeypatch.setattr(
        bootstrap, "bootstrap_policy", lambda size, seed, task: built.append((size, seed, task)) or tmp_path
    )
    monkeypatch.setattr(shipped, "shipped_policy", lambda size: shipped.SHIPPED[size].policy)
    args = argparse.Namespace(model=None, from_scratch=True, size="tiny", seed=3)
    assert demo_setup.policy_of(args) == tmp_path and built == [("tiny", 3, None)]
    args.size = "deep"  # a shipped size bootstraps on its own task
    assert demo_setup.policy_of(args) == tmp_path and built[-1] == ("deep", 3, "doubling_checks")
    args.from_scratch = False
    assert demo_setup.policy_of(args) == shipped.SHIPPED["deep"].policy and len(built) == 2
    args.size = "small"
    assert demo_setup.policy_of(args) == shipped.SHIPPED["small"].policy and len(built) == 2
    args.size = "tiny"
    with pytest.raises(ValueError, match="--from-scratch"):
        demo_setup.policy_of(args)
    # the regime follows the size unless given
    for size, want in (("small", "short"), ("deep", "self_checks"), ("tiny", "short")):
        ns = argparse.Namespace(
            size=size, regime=None, max_new_tokens=None, prompts_per_step=None, samples_per_prompt=None
        )
        assert demo_setup.apply_regime(ns).name == regime(want).task and ns.regime == want
    ns = argparse.Namespace(
        size="deep", regime="short", max_new_tokens=None, prompts_per_step=None, samples_per_prompt=None
    )
    assert demo_setup.apply_regime(ns).name == "doubling" and ns.regime == "short"


def test_eval_prompts_zero_turns_the_held_out_figures_off_and_a_sampled_eval_without_prompts_is_refused(
    tiny_qwen2, tmp_path, capsys
):
    import gleanrl.demo

    p = argparse.ArgumentParser()
    gleanrl.demo.add_arguments(p)
    args = p.parse_args(["--model", str(tiny_qwen2), "--eval-prompts", "0"])
    demo_setup.apply_regime(args)  # as the demo does: the regime fills the step's shape
    cfg = demo_setup.rl_config(tiny_qwen2, tmp_path / "run", args, 0, evaluate=True)
    assert cfg.eval_every == 0  # 0 prompts reached no TrainConfig check: no held-out evaluation at all
    args = p.parse_args(["--model", str(tiny_qwen2), "--eval-prompts", "0", "--eval-every", "2"])
    demo_setup.apply_regime(args)
    with pytest.raises(ValueError, match="--eval-prompts must be >= 1"):
        demo_setup.rl_config(tiny_qwen2, tmp_path / "run", args, 0, evaluate=True)
    # the CLI refuses it before any server starts: exit 2, nothing written
    argv = [
        "demo",
        "--out",
        str(tmp_path / "d"),
        "--model",
        str(tiny_qwen2),
        "--eval-prompts",
        "0",
        "--eval-every",
        "2",
    ]
    assert gleanrl.cli.main(argv) == 2
    assert "--eval-prompts must be >= 1" in capsys.readouterr().err and not (tmp_path / "d" / "server.log").exists()
