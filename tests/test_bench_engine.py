"""`gleanrl bench engine` runs end to end on a tiny model (the gleanrl arm; the sglang arm where
stock SGLang is installed) and writes the documented JSON."""

from __future__ import annotations

import json

import pytest

import gleanrl.cli
from gleanrl.bench.serve_process import sglang_missing

SMALL = [
    "--single-tokens",
    "8",
    "--repeats",
    "1",
    "--prompts",
    "2",
    "--n",
    "2",
    "--steps",
    "1",
    "--max-new-tokens",
    "8",
    "--buckets",
    "1,3",
    "--bucket-tokens",
    "5",
    "--dtype",
    "float32",
]


def test_bench_engine_json(tiny_qwen2, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = gleanrl.cli.main(
        ["bench", "engine", "--model", str(tiny_qwen2), "--arms", "gleanrl", "--json", str(out), *SMALL]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    arm = res["arms"]["gleanrl"]
    assert arm["single_tok_s"] > 0 and len(arm["grpo"]) == 1 and arm["grpo"][0]["output_tokens"] > 0
    assert set(arm["iteration_ms"]) == set(res["forward_ms"]) == {"1", "3"}
    for b, ms in arm["iteration_ms"].items():
        assert res["forward_ms"][b] > 0
        assert arm["iteration_over_forward"][b] == pytest.approx(ms / res["forward_ms"][b], abs=0.01)
    assert "ms/iteration" in capsys.readouterr().out


@pytest.mark.sglang
@pytest.mark.skipif(sglang_missing() is not None, reason=str(sglang_missing()))
def test_bench_engine_sglang_arm(tiny_qwen2, tmp_path):
    out = tmp_path / "bench.json"
    assert gleanrl.cli.main(["bench", "engine", "--model", str(tiny_qwen2), "--json", str(out), *SMALL]) == 0
    res = json.loads(out.read_text())
    assert set(res["arms"]) == {"gleanrl", "sglang"} and not res["skipped"]
    sg = res["arms"]["sglang"]
    assert sg["single_tok_s"] > 0 and sg["grpo"][0]["output_tokens"] > 0
    ratio = res["gleanrl_over_sglang"]
    assert ratio["single"] == pytest.approx(res["arms"]["gleanrl"]["single_tok_s"] / sg["single_tok_s"], abs=0.01)


def test_bench_engine_refuses_bad_input(tmp_path, capsys):
    assert gleanrl.cli.main(["bench", "engine", "--model", str(tmp_path / "nope")]) == 2
    assert "error" in capsys.readouterr().err
    assert gleanrl.cli.main(["bench", "engine", "--model", str(tmp_path), "--arms", "vllm"]) == 2
    assert "unknown arm" in capsys.readouterr().err
