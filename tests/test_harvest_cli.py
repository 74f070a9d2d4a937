"""`gleanrl train` harvest flags: validated, refused without --drafter, stored in OUT/harvest so
that the loop's HarvestHooks use them and `--resume` keeps them unless flags change them."""

from __future__ import annotations

import argparse

import gleanrl.cli
from gleanrl.base.flags import given
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.config import read_config
from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.trainer import cli
from gleanrl.trainer.config import TrainConfig, build_config


def _settings(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(argv)
    cfg = build_config({}, given(TrainConfig, args))
    cli.harvest_settings(cfg, args)
    return args


def test_harvest_flags_reach_the_harvester_and_survive_resume(tiny_qwen2, tmp_path):
    drafter = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "d0")
    out = tmp_path / "run"
    base = ["--model", str(tiny_qwen2), "--out", str(out), "--drafter", str(drafter)]
    _settings(
        base
        + [
            "--push-every",
            "7",
            "--accept-mode",
            "greedy",
            "--spool-mem-tokens",
            "5000",
            "--drafter-max-tokens",
            "0",
            "--holdout-every",
            "3",
        ]
    )
    hooks, _ = HarvestHooks.for_run(str(tiny_qwen2), str(drafter), out / "harvest", resume=False)
    cfg = hooks.h.cfg
    assert (cfg.push_every, cfg.accept_mode, cfg.max_tokens) == (7, "greedy", 0)
    assert hooks.h.spool.cfg.max_mem_tokens == 5000 and hooks.h.spool.cfg.holdout_every == 3
    _settings(base + ["--resume", "--max-holdout", "5"])  # resume: kept, plus the new flag
    cfg = read_config(out / "harvest")
    assert (cfg.push_every, cfg.max_holdout, cfg.spool.max_mem_tokens) == (7, 5, 5000)
    _settings(base)  # a fresh run starts from the defaults
    assert read_config(out / "harvest").push_every == 25


def test_harvest_flags_are_validated(tiny_qwen2, tmp_path, capsys):
    drafter = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "d0")
    base = ["train", "--model", str(tiny_qwen2), "--out", str(tmp_path / "run")]
    assert gleanrl.cli.main(base + ["--push-every", "3"]) == 2
    assert "--push-every: harvest settings, which need --drafter" in capsys.readouterr().err
    assert gleanrl.cli.main(base + ["--drafter", str(drafter), "--max-holdout", "0"]) == 2
    assert "max_holdout must be an integer >= 1" in capsys.readouterr().err
    assert gleanrl.cli.main(base + ["--drafter", str(drafter), "--version-decay", "1.5"]) == 2
    assert "version_decay" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
