"""`gleanrl bench rollout` runs its four arms end to end on a tiny model and a random drafter and
writes the documented JSON; the greedy pass of every SD arm equals the plain one token for token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gleanrl.cli
from gleanrl.bench.serve_process import sglang_missing
from sd_util import random_drafter


def test_bench_rollout_json(tiny_qwen2, tmp_path, capsys):
    drafter = random_drafter(tiny_qwen2, tmp_path / "drafter")
    out = tmp_path / "rollout.json"
    rc = gleanrl.cli.main(
        [
            "bench",
            "rollout",
            "--model",
            str(tiny_qwen2),
            "--drafter",
            str(drafter),
            "--prompts",
            "2",
            "--n",
            "3",
            "--steps",
            "2",
            "--max-new-tokens",
            "12",
            "--json",
            str(out),
            "--arms",
            "plain,eagle,group,fused",
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["arms"]) == {"plain", "eagle", "group", "fused"}
    for r in data["arms"].values():
        assert r["rollout_s"] > 0 and r["tok_s"] > 0 and r["target_passes"] > 0
        # the controller may keep an arm plain
        assert r["accept_length"] == 0.0 or r["accept_length"] >= 1.0
        assert r["tokens_per_pass"] >= 1.0
    assert data["arms"]["plain"]["tokens_per_pass"] == 1.0 and data["arms"]["plain"]["verify_passes"] == 0
    assert data["arms"]["plain"]["serve_flags"].startswith("--sd off")
    assert data["arms"]["fused"]["serve_flags"].startswith(f"--drafter {drafter} --sd-sources eagle,group,fused")
    for arm in ("eagle", "group", "fused"):
        ratio = data["arms"]["plain"]["rollout_s"] / data["arms"][arm]["rollout_s"]
        assert abs(data[f"speedup_{arm}"] - ratio) < 0.01 + 0.01 * ratio
    # 3 SD arms x 2 prompts x 3 samples
    assert data["identical_greedy"] == "18/18"
    assert data["arms"]["group"]["spec_accept_token_num_by_source"]["eagle"] == 0
    assert data["arms"]["eagle"]["spec_accept_token_num_by_source"]["group"] == 0
    assert "speedup_fused" in capsys.readouterr().out


def test_bench_rollout_refuses_unknown_arms(tiny_qwen2, capsys):
    argv = ["bench", "rollout", "--model", str(tiny_qwen2), "--drafter", "x", "--arms", "plain,tree"]
    assert gleanrl.cli.main(argv) == 2
    assert "--arms" in capsys.readouterr().err


def test_default_drafter_is_warm_started_on_the_task(tiny_qwen2, tmp_path, monkeypatch):
    """Without --drafter the bench warm-starts one (cached) on the task's prompts; the warm start
    itself is stubbed here (a random drafter), the argument plumbing and the cache are real."""
    import argparse

    from gleanrl import draft_train
    from gleanrl.bench import rollout
    from gleanrl.harvest.cli_init import init_drafter

    seen = []

    def fake_warm_start(policy, prompts, cfg):
        seen.append((len(prompts), cfg.max_new_tokens))
        return init_drafter(policy, seed=0), [{"accept_length": 1.0}]

    monkeypatch.setenv("GLEANRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(draft_train, "warm_start", fake_warm_start)
    parser = argparse.ArgumentParser()
    rollout.add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_qwen2), "--task", "running_sums", "--max-new-tokens", "12"])
    model, drafter = rollout._default_paths(args)
    assert model == str(tiny_qwen2) and seen == [(256, 12)]  # --warm-prompts' default
    assert (tmp_path / "cache" / "drafters").is_dir() and (Path(drafter) / "config.json").is_file()
    assert rollout._default_paths(args) == (model, drafter) and len(seen) == 1  # cached


@pytest.mark.sglang
@pytest.mark.skipif(sglang_missing() is not None, reason=str(sglang_missing()))
def test_bench_rollout_stock_sglang_arm(tiny_qwen2, tmp_path):
    out = tmp_path / "rollout.json"
    assert (
        gleanrl.cli.main(
            [
                "bench",
                "rollout",
                "--model",
                str(tiny_qwen2),
                "--drafter",
                "unused",
                "--prompts",
                "2",
                "--n",
                "2",
                "--steps",
                "1",
                "--max-new-tokens",
                "8",
                "--dtype",
                "float32",
                "--arms",
                "plain,sglang",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    sg = data["arms"]["sglang"]
    assert sg["tokens"] > 0 and sg["serve_flags"].startswith("--backend sglang") and not data["skipped"]
    assert data["over_sglang"]["plain"] == pytest.approx(sg["rollout_s"] / data["arms"]["plain"]["rollout_s"], abs=0.01)
