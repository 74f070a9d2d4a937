"""`gleanrl bench rollout` runs its four arms end to end on a tiny model and a random drafter and writes
the documented JSON; the greedy pass of every SD arm equals the plain one token for token."""
from __future__ import annotations

import json

import gleanrl.cli
from sd_util import random_drafter


def test_bench_rollout_json(tiny_qwen2, tmp_path, capsys):
    drafter = random_drafter(tiny_qwen2, tmp_path / "drafter")
    out = tmp_path / "rollout.json"
    rc = gleanrl.cli.main(["bench", "rollout", "--model", str(tiny_qwen2), "--drafter", str(drafter), "--prompts", "2",
                           "--n", "3", "--steps", "2", "--max-new-tokens", "12", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["arms"]) == {"plain", "eagle", "group", "fused"}
    for arm, r in data["arms"].items():
        assert r["rollout_s"] > 0 and r["tok_s"] > 0
        if arm in ("eagle", "fused"):
            assert r["accept_length"] >= 1.0
        else:  # plain never verifies; a random tiny model's T = 1 siblings rarely share an n-gram
            assert r["accept_length"] == 0.0 or r["accept_length"] >= 1.0
    for arm in ("eagle", "group", "fused"):
        ratio = data["arms"]["plain"]["rollout_s"] / data["arms"][arm]["rollout_s"]
        assert abs(data[f"speedup_{arm}"] - ratio) < 0.01 + 0.01 * ratio
    assert data["identical_greedy"] == "18/18"                     # 3 SD arms x 2 prompts x 3 samples
    assert data["arms"]["group"]["accepted_by_source"]["eagle"] == 0
    assert data["arms"]["eagle"]["accepted_by_source"]["group"] == 0
    assert "speedup_fused" in capsys.readouterr().out


def test_bench_rollout_refuses_unknown_arms(tiny_qwen2, capsys):
    argv = ["bench", "rollout", "--model", str(tiny_qwen2), "--drafter", "x", "--arms", "plain,tree"]
    assert gleanrl.cli.main(argv) == 2
    assert "--arms" in capsys.readouterr().err
