"""`gleanrl bench layout`: the ratios from paired rounds, and a real run on a tiny model."""

from __future__ import annotations

import json
import os

import pytest

import gleanrl.cli
from gleanrl.bench.layout import summarize


def test_ratios_pair_rounds_and_name_the_fastest_layout():
    iters = {"single": {1: [4.0, 5.0, 6.0]}, "single_t1": {1: [8.0, 5.0, 3.0]}}
    grpo = {"single": [10.0, 12.0, 11.0], "single_t1": [20.0, 24.0, 22.0], "replicas": [5.0, 8.0, 10.0]}
    r = summarize(iters, grpo)
    assert r["t1_over_t2"][1] == [0.5, 1.0, 2.0]  # per round: 4/8, 5/5, 6/3
    assert r["grpo_speedup"]["single_t1"] == [0.5, 0.5, 0.5]
    assert r["grpo_speedup"]["replicas"] == [1.1, 1.5, 2.0]  # 11/10, 12/8, 10/5 sorted
    assert r["best_layout"] == "replicas"


def test_refuses_a_model_that_is_not_one(tmp_path, capsys):
    assert gleanrl.cli.main(["bench", "layout", "--model", str(tmp_path)]) == 2
    assert "not a Hugging Face model directory" in capsys.readouterr().err


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_bench_layout_runs_every_layout(tiny_qwen2, tmp_path):
    js = tmp_path / "layout.json"
    assert (
        gleanrl.cli.main(
            [
                "bench",
                "layout",
                "--model",
                str(tiny_qwen2),
                "--buckets",
                "1,2",
                "--bucket-tokens",
                "32",  # a 1-token and a 32-token request differ by 31 iterations: more than a loaded machine's jitter
                "--prompts",
                "2",
                "--n",
                "2",
                "--max-new-tokens",
                "8",
                "--rounds",
                "1",
                "--dtype",
                "float32",
                "--json",
                str(js),
            ]
        )
        == 0
    )
    r = json.loads(js.read_text())
    assert set(r["grpo_s"]) == {"single", "single_t1", "replicas"}
    assert all(len(v) == 1 and v[0] > 0 for v in r["grpo_s"].values())
    assert set(r["t1_over_t2"]) == {"1", "2"} and r["best_layout"] in r["grpo_s"]
