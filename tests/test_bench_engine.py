"""`gleanrl bench engine` runs end to end on a tiny model and writes the documented JSON."""
from __future__ import annotations

import json

import gleanrl.cli


def test_bench_engine_json(tiny_qwen2, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = gleanrl.cli.main(["bench", "engine", "--model", str(tiny_qwen2), "--json", str(out),
                       "--max-new-tokens", "24", "--batch1-tokens", "8", "--repeats", "1"])
    assert rc == 0
    results = json.loads(out.read_text())["results"]
    assert [r["batch"] for r in results] == [1, 16]
    for r in results:
        assert set(r) >= {"batch", "engine_tok_s", "hf_tok_s", "ratio"}
        assert r["engine_tok_s"] > 0 and r["hf_tok_s"] > 0
        assert abs(r["ratio"] - r["engine_tok_s"] / r["hf_tok_s"]) < 0.02 * r["ratio"] + 0.01
    assert "ratio" in capsys.readouterr().out


def test_bench_engine_missing_model(tmp_path, capsys):
    assert gleanrl.cli.main(["bench", "engine", "--model", str(tmp_path / "nope")]) == 2
    assert "error" in capsys.readouterr().err
