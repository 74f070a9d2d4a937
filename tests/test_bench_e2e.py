"""`gleanrl bench e2e`: the summary's arithmetic on known rows (all arms and a subset), and one tiny
run of every default arm (keys present and consistent; no timing asserts)."""

from __future__ import annotations

import json

import pytest

import gleanrl.cli
from gleanrl.bench.e2e import DEFAULT_ARMS, RUNS, parse_arms
from gleanrl.bench.e2e_summary import step_times, summarize
from gleanrl.bench.serve_process import sglang_missing
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter


def _rows(step_s: list[float], accept: list[float] | float, rewards: list[float], overrun: float = 0.0) -> list[dict]:
    accept = accept if isinstance(accept, list) else [accept] * len(step_s)
    return [
        {
            "step": i + 1,
            "rollout_s": s - 1.0,
            "train_s": 0.75,
            "push_s": 0.25,
            "spec_accept_length": acc,
            "reward_mean": r,
            "accuracy": r / 2,
            "idle_overrun_s": overrun,
            "drafter_version": i,
            "tail_s": 1.0,
        }
        for i, (s, acc, r) in enumerate(zip(step_s, accept, rewards))
    ]


def test_summary_arithmetic():
    runs = {
        "a_no_sd": _rows([4, 4], 0.0, [0.1, 0.3]),
        "b_adaptive": _rows([2, 2], 3.0, [0.2, 0.3], overrun=0.04),
        "c_stale": _rows([3, 3], 2.0, [0.1, 0.2]),
        "d_stale_harvest": _rows([3.3, 3.3], 2.0, [0.1, 0.2]),
        "cold_adaptive": _rows([3, 2], [1.0, 3.0], [0.1, 0.3]),
        "cold_stale": _rows([4, 4], 1.0, [0.1, 0.3]),
        "offdomain_adaptive": _rows([3, 2], [1.5, 3.5], [0.1, 0.3]),
        "offdomain_stale": _rows([3, 3], [1.5, 2.5], [0.1, 0.3]),
        "a_no_sd_seed2": _rows([4, 4], 0.0, [0.3, 0.4]),
        "a_sglang": _rows([5, 5], 0.0, [0.1, 0.2]),
        "a_replicas": _rows([4.4, 4.4], 0.0, [0.1, 0.3]),
    }
    assert set(runs) == set(RUNS)
    s = summarize(runs, {name: 10.0 for name in runs})
    assert s["baseline"] == "a_no_sd" and s["step_time_sglang"] == [5, 5]
    assert s["replicas_speedup"] == pytest.approx(1 / 1.1) and s["replicas_speedup_ci95"] == [0.9091] * 2
    assert s["speedup_e2e_ci95"] == [2.0, 2.0] and s["harvest_rollouts_over_stale"] == pytest.approx(2 / 1)
    assert s["steps"] == 2 and s["speedup_e2e"] == pytest.approx(2.0) and s["wall_s"]["cold_stale"] == 10.0
    assert s["accept_len_adaptive"] == pytest.approx(3.0) and s["accept_len_stale"] == pytest.approx(2.0)
    assert s["drafter_overhead"] == pytest.approx(0.08 / 4)
    assert s["accept_ratio"] == pytest.approx(1.5) and s["accept_ratio_late"] == pytest.approx(1.5)
    assert s["samedomain_accept_ratio"] == pytest.approx(1.5) and s["offdomain_accept_ratio"] == pytest.approx(1.4)
    assert s["cold_accept_per_step"] == [1.0, 3.0] and s["speedup_cold"] == pytest.approx(8 / 5)
    assert s["rollout_share_a"] == pytest.approx(6 / 8) and s["speedup_rollout"] == pytest.approx(6 / 2)
    assert s["tail_share_a"] == pytest.approx(2 / 6)
    assert s["speedup_stale"] == pytest.approx(4 / 3) and s["harvest_cost"] == pytest.approx(0.1)
    assert s["reward_gap_ab"] == pytest.approx(0.05) and s["reward_noise_seed"] == pytest.approx(0.15)
    assert s["reward_a"] == [0.1, 0.3] and s["reward_b"] == [0.2, 0.3] and s["drafter_version"] == 1

    # the faster no-SD arm is the baseline
    faster = summarize(runs | {"a_sglang": _rows([3, 3], 0.0, [0.1, 0.2])})
    assert faster["baseline"] == "a_sglang" and faster["speedup_e2e"] == pytest.approx(6 / 4)
    assert faster["rollout_share_a"] == pytest.approx(4 / 6) and faster["reward_noise_seed"] == s["reward_noise_seed"]

    part = summarize({"a_no_sd": runs["a_no_sd"], "cold_adaptive": runs["cold_adaptive"]})
    assert set(part) == set(s)  # the same keys whatever ran
    assert part["speedup_e2e"] is None and part["offdomain_accept_ratio"] is None and part["harvest_cost"] is None
    assert part["speedup_cold"] == pytest.approx(8 / 5) and part["arms"] == ["a_no_sd", "cold_adaptive"]


def test_running_histogram_pushes_and_the_modelled_ceiling():
    from gleanrl.bench.e2e import parse_speedups
    from gleanrl.trainer.metrics import running_seconds

    # 3 requests: 0-4 s, 0-4 s, 0-10 s -> 4 s at 3 running ("4"), 6 s at 1 running
    hist = running_seconds([(0.0, 4.0), (0.0, 4.0), (0.0, 10.0)])
    assert hist["4"] == pytest.approx(4.0) and hist["1"] == pytest.approx(6.0)
    assert sum(hist.values()) == pytest.approx(10.0)
    a = _rows([12, 12], 0.0, [0.1, 0.2])  # rollouts 11 s of each 12 s step
    for row in a:
        row["running_s"] = {"1": 6.0, "4": 5.0}
    b = _rows([10, 10], 2.0, [0.1, 0.2])
    for i, row in enumerate(b):
        row["drafter_pushes"], row["push_gains"] = i, [(0.3, 0.1)] * i
    s = summarize({"a_no_sd": a, "b_adaptive": b})
    assert s["running_hist_s"] == {"1": 12.0, "4": 10.0}
    assert s["share_le2_running"] == pytest.approx(12 / 22)
    # bucket 1 halves (2 tokens per verify pass), bucket 4 stays: 22 s of rollouts -> 16 s
    assert s["ceiling_rollout"] == pytest.approx(22 / 16)
    share = 22 / 24
    assert s["ceiling_e2e"] == pytest.approx(1 / ((1 - share) + share / (22 / 16)))
    assert s["pushes_per_step"]["b_adaptive"] == pytest.approx(0.5)
    assert s["push_gains"]["b_adaptive"] == [(0.3, 0.1)]
    measured = summarize({"a_no_sd": a, "b_adaptive": b}, sd_speedups=parse_speedups("1:3,4:1.25"))
    assert measured["ceiling_rollout"] == pytest.approx(22 / (12 / 3 + 10 / 1.25))
    with pytest.raises(ValueError, match="BUCKET:SPEEDUP"):
        parse_speedups("3:2")


def test_arms_parsed_in_order_and_refused_by_name():
    assert parse_arms("c_stale, a_no_sd") == ["a_no_sd", "c_stale"]
    with pytest.raises(ValueError, match="unknown arm.*warm"):
        parse_arms("a_no_sd,warm")
    assert "d_stale_harvest" not in DEFAULT_ARMS and len(DEFAULT_ARMS) == 10


def test_bench_e2e_tiny_run(tiny_qwen2, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GLEANRL_CACHE", str(tmp_path / "cache"))
    drafter = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "drafter0")
    other = save_drafter(init_drafter(tiny_qwen2, seed=1), tmp_path / "drafter_other")
    out, js = tmp_path / "bench", tmp_path / "bench.json"
    args = [
        "bench",
        "e2e",
        "--out",
        str(out),
        "--json",
        str(js),
        "--model",
        str(tiny_qwen2),
        "--steps",
        "1",
        "--prompts-per-step",
        "2",
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "16",
        "--dtype",
        "float32",
    ]
    assert gleanrl.cli.main(args + ["--drafter", str(tmp_path / "none"), "--offdomain-drafter", str(other)]) == 2
    assert gleanrl.cli.main(args + ["--arms", "a_no_sd,nope"]) == 2
    assert "unknown arm(s) nope" in capsys.readouterr().err
    # stock SGLang: the sglang-marked test below
    arms = [a for a in DEFAULT_ARMS if a != "a_sglang"]
    assert (
        gleanrl.cli.main(
            args
            + ["--drafter", str(drafter), "--offdomain-drafter", str(other), "--arms", ",".join(arms), "--sd", "on"]
        )
        == 0
    )
    s = json.loads(js.read_text())
    for key in (
        "speedup_e2e",
        "accept_len_adaptive",
        "accept_len_stale",
        "steps",
        "reward_a",
        "reward_b",
        "reward_gap_ab",
        "reward_noise_seed",
        "rollout_share_a",
        "speedup_rollout",
        "cold_accept_per_step",
        "offdomain_accept_ratio",
        "samedomain_accept_ratio",
        "heldout_accept_adaptive",
        "heldout_accept_stale",
        "accept_ratio_late",
        "idle_train_s",
        "ceiling_e2e",
        "ceiling_rollout",
        "pushes_per_step",
        "running_hist_s",
        "share_le2_running",
        "model",
        "drafter",
    ):
        assert key in s
    assert s["model"] == str(tiny_qwen2) and s["drafter"] == str(drafter)
    assert sum(s["running_hist_s"].values()) > 0 and set(s["pushes_per_step"]) == set(arms)
    assert s["steps"] == 1 and s["speedup_e2e"] > 0 and len(s["reward_a_seed2"]) == 1 and s["regime"] == "self_checks"
    assert set(s["wall_s"]) == set(arms) == set(s["arms"]) and all(v > 0 for v in s["wall_s"].values())
    assert 0 < s["rollout_share_a"] < 1 and len(s["cold_accept_per_step"]) == 1
    # SD ran in both drafter arms
    assert s["accept_len_adaptive"] >= 1.0 and s["accept_len_stale"] >= 1.0
    assert s["samedomain_accept_ratio"] == pytest.approx(s["accept_len_adaptive"] / s["accept_len_stale"])
    assert set(s["heldout_accept"]) == {"b_adaptive", "cold_adaptive", "offdomain_adaptive"}
    assert all((out / name / "metrics.jsonl").exists() for name in arms)
    # the baseline is the fastest no-SD arm by its step times (which one wins a tiny run is chance)
    rows = lambda n: [json.loads(line) for line in (out / n / "metrics.jsonl").open()]  # noqa: E731
    no_sd = {n: sum(step_times(rows(n))) for n in ("a_no_sd", "a_replicas")}
    assert s["baseline"] == min(no_sd, key=no_sd.get)
    assert not (out / "d_stale_harvest").exists() and (out / "cold_drafter0" / "config.json").exists()
    assert not (tmp_path / "cache" / "drafters").exists()  # the given drafters, no warm start


def test_arms_run_abba_each_resumed_for_its_second_half():
    from gleanrl.bench.e2e import schedule

    assert schedule(["a", "b", "c"], 12) == [
        ("a", 6, False),
        ("b", 6, False),
        ("c", 6, False),
        ("c", 12, True),
        ("b", 12, True),
        ("a", 12, True),
    ]
    assert schedule(["a", "b"], 1) == [("a", 1, False), ("b", 1, False)]


def test_bench_e2e_abba_resumes_a_harvest_arm(tiny_qwen2, tmp_path, monkeypatch):
    """Two steps: each arm's step 2 runs after the other's, resumed from its checkpoint with its
    harvest state (spool, drafter versions): every step is in the arm's metrics once."""
    monkeypatch.setenv("GLEANRL_CACHE", str(tmp_path / "cache"))
    drafter = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "drafter0")
    out, js = tmp_path / "bench", tmp_path / "bench.json"
    assert (
        gleanrl.cli.main(
            [
                "bench",
                "e2e",
                "--out",
                str(out),
                "--json",
                str(js),
                "--model",
                str(tiny_qwen2),
                "--steps",
                "2",
                "--prompts-per-step",
                "2",
                "--samples-per-prompt",
                "2",
                "--max-new-tokens",
                "16",
                "--dtype",
                "float32",
                "--drafter",
                str(drafter),
                "--arms",
                "a_no_sd,b_adaptive",
                "--sd",
                "on",
                "--push-every",
                "1",
            ]
        )
        == 0
    )
    s = json.loads(js.read_text())
    for name in ("a_no_sd", "b_adaptive"):
        rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
    assert len(s["step_time"]["b_adaptive"]) == 2 and s["speedup_e2e_ci95"] is not None
    assert s["push_why_last"]["b_adaptive"]  # the gate said what it did
    assert (out / "b_adaptive" / "harvest" / "spool").is_dir()


@pytest.mark.sglang
@pytest.mark.skipif(sglang_missing() is not None, reason=str(sglang_missing()))
def test_bench_e2e_quick_with_stock_sglang(tiny_qwen2, tmp_path, monkeypatch):
    """`--quick`'s no-SD arms, one step each: the GRPO loop against stock SGLang CPU; the faster is
    the baseline."""
    monkeypatch.setenv("GLEANRL_CACHE", str(tmp_path / "cache"))
    out, js = tmp_path / "bench", tmp_path / "bench.json"
    assert (
        gleanrl.cli.main(
            [
                "bench",
                "e2e",
                "--quick",
                "--arms",
                "a_no_sd,a_sglang",
                "--steps",
                "1",
                "--out",
                str(out),
                "--json",
                str(js),
                "--model",
                str(tiny_qwen2),
                "--prompts-per-step",
                "2",
                "--samples-per-prompt",
                "2",
                "--max-new-tokens",
                "16",
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    s = json.loads(js.read_text())
    assert s["arms"] == ["a_no_sd", "a_sglang"] and len(s["step_time_sglang"]) == 1
    assert s["baseline"] == min(("a_no_sd", "a_sglang"), key=lambda n: sum(s["step_time"][n]))
    assert (out / "a_sglang" / "metrics.jsonl").exists()
