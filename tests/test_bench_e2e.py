"""`gleanrl bench e2e`: the summary's arithmetic on known rows, and one tiny run of all four arms."""
from __future__ import annotations

import json

import pytest

import gleanrl.cli
from gleanrl.bench.e2e import RUNS, summarize
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter


def _rows(step_s: list[float], accept: float, rewards: list[float], overrun: float = 0.0) -> list[dict]:
    return [{"step": i + 1, "rollout_s": s - 1.0, "train_s": 0.75, "push_s": 0.25, "spec_accept_length": accept,
             "reward_mean": r, "accuracy": r / 2, "idle_overrun_s": overrun, "drafter_version": i}
            for i, (s, r) in enumerate(zip(step_s, rewards))]


def test_summary_arithmetic():
    runs = {"a_no_sd": _rows([4, 4], 0.0, [0.1, 0.3]), "b_adaptive": _rows([2, 2], 3.0, [0.2, 0.3], overrun=0.04),
            "c_stale": _rows([3, 3], 2.0, [0.1, 0.2]), "d_stale_harvest": _rows([3.3, 3.3], 2.0, [0.1, 0.2]),
            "a_no_sd_seed2": _rows([4, 4], 0.0, [0.3, 0.4])}
    assert set(runs) == set(RUNS)
    s = summarize(runs)
    assert s["steps"] == 2 and s["speedup_e2e"] == pytest.approx(2.0)
    assert s["accept_len_adaptive"] == pytest.approx(3.0) and s["accept_len_stale"] == pytest.approx(2.0)
    assert s["drafter_overhead"] == pytest.approx(0.08 / 4)
    assert s["accept_ratio"] == pytest.approx(1.5) and s["accept_ratio_late"] == pytest.approx(1.5)
    assert s["speedup_stale"] == pytest.approx(4 / 3) and s["harvest_cost"] == pytest.approx(0.1)
    assert s["reward_gap_ab"] == pytest.approx(0.05) and s["reward_noise_seed"] == pytest.approx(0.15)
    assert s["reward_a"] == [0.1, 0.3] and s["reward_b"] == [0.2, 0.3] and s["drafter_version"] == 1


def test_bench_e2e_tiny_run(tiny_qwen2, tmp_path, monkeypatch):
    monkeypatch.setenv("GLEANRL_CACHE", str(tmp_path / "cache"))
    drafter = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "drafter0")
    out, js = tmp_path / "bench", tmp_path / "bench.json"
    args = ["bench", "e2e", "--out", str(out), "--json", str(js), "--model", str(tiny_qwen2), "--steps", "1",
            "--prompts-per-step", "2", "--samples-per-prompt", "2", "--max-new-tokens", "16"]
    assert gleanrl.cli.main(args + ["--drafter", str(tmp_path / "none")]) == 2
    assert gleanrl.cli.main(args + ["--drafter", str(drafter), "--dtype", "float32"]) == 0
    s = json.loads(js.read_text())
    for key in ("speedup_e2e", "accept_len_adaptive", "accept_len_stale", "steps", "reward_a", "reward_b"):
        assert key in s
    assert s["steps"] == 1 and s["speedup_e2e"] > 0 and len(s["reward_a_seed2"]) == 1
    assert {"heldout_accept_adaptive", "heldout_accept_stale", "accept_ratio_late", "idle_train_s"} <= set(s)
    assert s["accept_len_adaptive"] >= 1.0 and s["accept_len_stale"] >= 1.0  # SD ran in both drafter arms
    assert all((out / name / "metrics.jsonl").exists() for name in RUNS)
    assert not (tmp_path / "cache" / "drafters").exists()  # the given drafter, no warm start
