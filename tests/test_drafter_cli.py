"""`gleanrl draft init` and `gleanrl draft train` end to end on a tiny target."""

from __future__ import annotations

import json

import pytest

from gleanrl.cli import main
from gleanrl.harvest.checkpoint import load_drafter


def test_draft_init_writes_a_loadable_drafter(tiny_qwen2, tmp_path, capsys):
    assert (
        main(
            [
                "draft",
                "init",
                "--model",
                str(tiny_qwen2),
                "--out",
                str(tmp_path / "d"),
                "--seed",
                "5",
                "--layer-ids",
                "0,1,2",
            ]
        )
        == 0
    )
    d = load_drafter(tmp_path / "d", target_config=tiny_qwen2)
    assert d.config.aux_layer_ids == [0, 1, 2]
    assert "aux layer ids [0, 1, 2]" in capsys.readouterr().out


def test_draft_init_rejects_bad_input(tmp_path, capsys, tiny_qwen2):
    assert main(["draft", "init", "--model", str(tmp_path), "--out", str(tmp_path / "d")]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert (
        main(["draft", "init", "--model", str(tiny_qwen2), "--out", str(tmp_path / "d"), "--layer-ids", "2,1,0"]) == 2
    )
    assert "increasing" in capsys.readouterr().err


def test_draft_train_from_prompts_file(tiny_qwen2, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Question: what is {i} + {i}? Answer:"}) + "\n" for i in range(10))
    )
    log = tmp_path / "log.jsonl"
    rc = main(
        [
            "draft",
            "train",
            "--model",
            str(tiny_qwen2),
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "d"),
            "--max-new-tokens",
            "12",
            "--steps",
            "6",
            "--eval-every",
            "3",
            "--gen-batch",
            "5",
            "--topk",
            "16",
            "--heldout",
            "0.2",
            "--log",
            str(log),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "held-out acceptance length" in out and "expected when sampling" in out
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7)) and {"accept_length", "accept_length_sampled"} <= set(rows[2])
    load_drafter(tmp_path / "d", target_config=tiny_qwen2)
    # continue from it
    assert (
        main(
            [
                "draft",
                "train",
                "--model",
                str(tiny_qwen2),
                "--prompts",
                str(prompts),
                "--out",
                str(tmp_path / "d2"),
                "--init",
                str(tmp_path / "d"),
                "--max-new-tokens",
                "8",
                "--steps",
                "2",
                "--gen-batch",
                "10",
            ]
        )
        == 0
    )


def test_draft_train_from_task(tiny_qwen2, tmp_path):
    pytest.importorskip("gleanrl.trainer.tasks")
    assert (
        main(
            [
                "draft",
                "train",
                "--model",
                str(tiny_qwen2),
                "--task",
                "running_sums",
                "--num-prompts",
                "6",
                "--out",
                str(tmp_path / "d"),
                "--max-new-tokens",
                "8",
                "--steps",
                "2",
                "--heldout",
                "0.3",
            ]
        )
        == 0
    )


def test_draft_train_bad_prompts_file(tiny_qwen2, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    assert (
        main(["draft", "train", "--model", str(tiny_qwen2), "--prompts", str(bad), "--out", str(tmp_path / "d")]) == 2
    )
    assert "bad.jsonl:1" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_warm_start_checkpoints_at_each_evaluation(tiny_qwen2, tmp_path):
    from gleanrl.draft_train import WarmStartConfig, warm_start

    seen = []
    cfg = WarmStartConfig(max_new_tokens=8, steps=4, eval_every=2, gen_batch=4, topk=16, heldout=0.25)
    prompts = [f"Question: what is {i} + {i}? Answer:" for i in range(8)]

    class Log:  # the step-2 checkpoint exists while step 3 trains
        def write(self, line):
            if json.loads(line)["step"] == 3:
                seen.append((tmp_path / "ckpt" / "model.safetensors").is_file())

        def flush(self):
            pass

    warm_start(tiny_qwen2, prompts, cfg, log=Log(), checkpoint=tmp_path / "ckpt")
    assert seen == [True]
    load_drafter(tmp_path / "ckpt", target_config=tiny_qwen2)
