"""`gleanrl train --server URL` runs two GRPO steps end to end against real SGLang (SD off):
rollouts from SGLang's /generate, policy updates pushed back through its
/update_weights_from_disk."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

import gleanrl.cli

pytestmark = pytest.mark.sglang


def test_two_grpo_steps_against_sglang(restore_weights, tmp_path, sglang_tokenizer):
    server, out = restore_weights, tmp_path / "run"
    rc = gleanrl.cli.main(
        [
            "train",
            "--model",
            str(server.model),
            "--out",
            str(out),
            "--server",
            server.url,
            "--steps",
            "2",
            "--prompts-per-step",
            "2",
            "--samples-per-prompt",
            "4",
            "--max-new-tokens",
            "24",
            "--seed",
            "0",
            "--eval-every",
            "0",
        ]
    )
    assert rc == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) >= 1 and "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["rollout_weight_version"] for r in rows] == ["0", "1"]
    # SGLang's logprobs (temperature 1, top_p 1) and the trainer's agree up to float32 kernel noise
    assert all(r["logprob_mismatch"] < 1e-3 for r in rows), [r["logprob_mismatch"] for r in rows]
    print(
        "\n[sglang] GRPO: "
        + "; ".join(
            f"step {r['step']} reward {r['reward_mean']:.3f} mismatch {r['logprob_mismatch']:.1e}" for r in rows
        )
    )
    assert httpx.get(f"{server.url}/model_info", timeout=10).json()["weight_version"] == "2"
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(out / "weight_v2", dtype=torch.float32).eval()
    ids = sglang_tokenizer.encode("12+30=")
    seq = list(ids)
    with torch.no_grad():
        for _ in range(8):
            seq.append(int(final(torch.tensor([seq])).logits[0, -1].argmax()))
    assert server.generate(ids, 8, ignore_eos=True)["output_ids"] == seq[len(ids) :]
