"""`gleanrl bench sd` runs end to end on a tiny model and a random drafter and writes the documented
JSON; at temperature 0 every SD output equals the plain one (a random drafter: most drafts
are rejected)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import gleanrl.cli
from engine_util import PROMPTS, hf_greedy
from sd_util import random_drafter


def test_bench_sd_json(tiny_qwen2, tmp_path, capsys):
    drafter = random_drafter(tiny_qwen2, tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "bench.json"
    rc = gleanrl.cli.main(
        [
            "bench",
            "sd",
            "--model",
            str(tiny_qwen2),
            "--drafter",
            str(drafter),
            "--prompts",
            str(prompts),
            "--json",
            str(out),
            "--batches",
            "1,3",
            "--max-new-tokens",
            "12",
            "--repeats",
            "1",
            "--sd",
            "on",
            "--num-draft-tokens",
            "3",
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert [(r["batch"], r["temperature"]) for r in data["results"]] == [(1, 0.0), (1, 1.0), (3, 0.0), (3, 1.0)]
    for r in data["results"]:
        assert r["sd_tok_s"] > 0 and r["plain_tok_s"] > 0 and 1.0 <= r["accept_length"] <= 4.0
        assert abs(r["speedup"] - r["sd_tok_s"] / r["plain_tok_s"]) < 0.01 + 0.01 * r["speedup"]
        for arm, it in r["per_iteration"].items():
            assert it["iteration_ms"] >= it["forward_ms"] > 0 and it["drafter_ms"] >= 0, arm
            assert abs(it["overhead_ms"] - (it["iteration_ms"] - it["forward_ms"] - it["drafter_ms"])) < 0.01, arm
        assert r["per_iteration"]["sd"]["drafter_ms"] > 0
        if r["temperature"] == 0:
            assert r["identical_outputs"] == f"{r['batch']}/{r['batch']}"
    # the drafter's ms per draft token over plain's ms per iteration, both at 1 running
    assert data["drafter_ms_per_token"] > 0 and data["plain_iteration_ms"] > 0
    assert abs(data["draft_cost_ratio"] - data["drafter_ms_per_token"] / data["plain_iteration_ms"]) < 0.01
    assert "identical" in capsys.readouterr().out


def test_bench_sd_missing_drafter(tiny_qwen2, tmp_path, capsys):
    assert gleanrl.cli.main(["bench", "sd", "--model", str(tiny_qwen2), "--drafter", str(tmp_path / "nope")]) == 2
    assert "error" in capsys.readouterr().err


def test_bench_sd_with_a_json_schema(tiny_qwen2, tmp_path, capsys):
    """`--json-schema`: every cell also runs under the schema's grammar, SD and plain both masked
    (greedy outputs identical), with the grammar's cost per token reported."""
    drafter = random_drafter(tiny_qwen2, tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = tmp_path / "bench.json"
    rc = gleanrl.cli.main(
        [
            "bench",
            "sd",
            "--model",
            str(tiny_qwen2),
            "--drafter",
            str(drafter),
            "--prompts",
            str(prompts),
            "--json",
            str(out),
            "--batches",
            "2",
            "--temperatures",
            "0",
            "--max-new-tokens",
            "10",
            "--repeats",
            "1",
            "--sd",
            "on",
            "--num-draft-tokens",
            "3",
            "--json-schema",
            json.dumps(schema),
        ]
    )
    assert rc == 0
    (r,) = json.loads(out.read_text())["results"]
    g = r["grammar"]
    assert g["sd_tok_s"] > 0 and g["plain_tok_s"] > 0 and g["identical_outputs"] == "2/2"
    assert g["ms_per_token"] > 0 and "overhead_ms_per_token" in g
    assert "ms/token" in capsys.readouterr().out
    assert (
        gleanrl.cli.main(
            ["bench", "sd", "--model", str(tiny_qwen2), "--drafter", str(drafter), "--json-schema", '{"type": "nope"}']
        )
        == 2
    )


def test_bench_sd_with_a_regex(tiny_qwen2, tmp_path):
    """`--regex`: the cells also run under the regex's grammar (SD greedy identical to plain), recorded in the JSON;
    one grammar option at a time."""
    drafter = random_drafter(tiny_qwen2, tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out, args = tmp_path / "bench.json", ["--batches", "2", "--temperatures", "0", "--max-new-tokens", "10"]
    base = ["bench", "sd", "--model", str(tiny_qwen2), "--drafter", str(drafter), "--prompts", str(prompts)]
    rc = gleanrl.cli.main(base + args + ["--repeats", "1", "--sd", "on", "--json", str(out), "--regex", "[a-z ]{3,40}"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["regex"] == "[a-z ]{3,40}" and report["json_schema"] is None
    g = report["results"][0]["grammar"]
    assert g["sd_tok_s"] > 0 and g["identical_outputs"] == "2/2" and g["ms_per_token"] > 0
    with pytest.raises(SystemExit):  # one grammar at a time
        gleanrl.cli.main(base + ["--regex", "a", "--json-schema", "any"])


def test_divergence_names_the_first_differing_token_and_its_log_prob_gap(tiny_qwen2, tiny_tokenizer):
    """`sd_checks.divergence`: for an output that leaves plain greedy at position 3, the position, both
    tokens, and the plain engine's gap log p(plain's) - log p(other), positive for the greedy choice and
    equal to the gap the model itself gives."""
    from gleanrl.bench.sd_checks import divergence
    from gleanrl.server.config import EngineConfig
    from gleanrl.server.engine import Engine

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    prompt = tiny_tokenizer(PROMPTS[0])["input_ids"]
    plain = hf_greedy(model, prompt, 6)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + plain[:3]])).logits[0, -1].float(), -1)
    other = int(logp.argsort(descending=True)[1])  # the runner-up at position 3
    engine = Engine(EngineConfig(model_path=str(tiny_qwen2), sd="off", dtype="float32"))
    engine.start()  # the gap is a scoring request through the running engine
    try:
        d = divergence(engine, prompt, plain, plain[:3] + [other, plain[4]])
        assert divergence(engine, prompt, plain, plain[:4]) == {"at": 4, "plain": plain[4], "sd": None}
    finally:
        engine.shutdown()
    assert (d["at"], d["plain"], d["sd"]) == (3, plain[3], other)
    assert d["logprob_gap"] > 0 and abs(d["logprob_gap"] - float(logp[plain[3]] - logp[other])) < 1e-3
