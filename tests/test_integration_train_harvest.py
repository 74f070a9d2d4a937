"""`gleanrl train --drafter DIR`: harvest from the trainer itself (embedded server serving the
drafter with adaptive SD, HarvestHooks over OUT/harvest), harvest columns in the terminal table, and
--resume keeping the spool and drafter versions (the server then serves the newest
pushed drafter)."""

from __future__ import annotations

import json
import time

import pytest

import gleanrl.cli
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.trainer import layout
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.metrics import COLUMNS, HARVEST_COLUMNS, MetricsLog, format_header, format_row


def test_harvest_columns_only_when_harvest_is_on(tmp_path):
    row = {
        "step": 1,
        "idle_used_s": 0.5,
        "drafter_version": 3,
        "spec_accept_length": 2.25,
        "heldout_accept_len": None,
        "sd_token_share": 0.4,
    }
    lines: list[str] = []
    MetricsLog(tmp_path / "a", harvest=True).log(row, echo=lines.append)
    MetricsLog(tmp_path / "b").log(row, echo=lines.append)
    assert lines[0] == format_header(COLUMNS + HARVEST_COLUMNS) and "dver" in lines[0] and "sd%" in lines[0]
    assert lines[1].split()[-4:] == ["0.50", "3", "2.25", "40%"]  # None prints blank
    assert "dver" not in lines[2] and lines[3] == format_row(row)


def test_drafter_must_be_a_directory(tiny_qwen2, tmp_path):
    with pytest.raises(ValueError, match="drafter must be"):
        TrainConfig(model=str(tiny_qwen2), out=str(tmp_path), drafter=str(tmp_path / "none"))


def test_train_drafter_harvests_and_resume_keeps_state(tiny_qwen2, tmp_path, capsys, monkeypatch):
    drafter0 = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "drafter0")
    commands: list[dict] = []
    settings = layout.EmbeddedServer.settings
    monkeypatch.setattr(layout.EmbeddedServer, "settings", lambda self: commands.append(settings(self)) or commands[-1])
    out = tmp_path / "run"
    base = [
        "train",
        "--model",
        str(tiny_qwen2),
        "--out",
        str(out),
        "--drafter",
        str(drafter0),
        "--prompts-per-step",
        "2",
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "24",
    ]
    assert gleanrl.cli.main(base + ["--steps", "1"]) == 0
    table = capsys.readouterr().out
    assert "dver" in table and "sd%" in table and "idle_s" in table
    cmd = commands[-1]
    assert cmd["drafter"] == str(drafter0) and cmd["sd"] == "adaptive"
    # where step 1's 4 rollouts went depends on timing (spooled in its idle window, captured by the
    # update and pending, or carried to the next window): every one is somewhere
    spool_files = {p.name for p in (out / "harvest" / "spool").rglob("*") if p.is_file()}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = rows[-1]
    assert _accounted(first) == 4 and (first["harvested"] == 0) == (not spool_files)

    # a fresh run over the same --out: refused
    assert gleanrl.cli.main(base + ["--steps", "1"]) == 2
    assert gleanrl.cli.main(base + ["--steps", "2", "--resume"]) == 0
    version = rows[-1]["drafter_version"]
    cmd = commands[-1]
    assert cmd["drafter"] == (
        str(out / "harvest" / "drafter_versions" / f"v{version:06d}") if version else str(drafter0)
    )
    assert spool_files <= {p.name for p in (out / "harvest" / "spool").rglob("*") if p.is_file()}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["drafter_version"] >= version
    # the resumed run kept what step 1 had not spooled: step 2 accounts for its own 4 and those
    carried = first["harvest_carried"] + first["harvest_pending"]
    assert _accounted(rows[-1]) - first["harvest_errors"] == 4 + carried

    # the harvest really harvests: rollouts captured into the spool and drafter micro-steps
    # trained on them. How much each (short) idle window fits depends on the machine's load, so
    # resume a few steps at a time until both happened (a loaded machine only takes more steps),
    # bounded generously; a micro-step of one sample trains as soon as one is spooled
    deadline = time.monotonic() + 300
    while not (_total(rows, "harvested") > 0 and _total(rows, "drafter_steps") > 0) and time.monotonic() < deadline:
        assert (
            gleanrl.cli.main(
                base
                + [
                    "--steps",
                    str(rows[-1]["step"] + 4),
                    "--resume",
                    "--drafter-batch-size",
                    "1",
                    "--drafter-max-tokens",
                    "32",
                ]
            )
            == 0
        )
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    seen = [(r["harvested"], r["drafter_steps"], r["idle_used_s"]) for r in rows]
    assert _total(rows, "harvested") > 0, f"nothing harvested (harvested, steps, idle_used_s): {seen}"
    assert _total(rows, "drafter_steps") > 0, f"no drafter micro-step (harvested, steps, idle_used_s): {seen}"
    assert any((out / "harvest" / "spool").rglob("*.safetensors"))  # the captures are on disk
    assert sum(r["idle_used_s"] for r in rows) > 0


def _total(rows: list[dict], key: str) -> int:
    return sum(r[key] for r in rows)


def _accounted(row: dict) -> int:
    """Rollouts a metrics row accounts for: spooled this step, queued, captured and not yet spooled,
    skipped (errors: counted over the run)."""
    return row["harvested"] + row["harvest_carried"] + row["harvest_pending"] + row["harvest_errors"]


def test_fresh_run_refuses_drafter_versions_of_an_earlier_one(tiny_qwen2, tmp_path):
    from gleanrl.harvest.hooks import HarvestHooks

    drafter0 = save_drafter(init_drafter(tiny_qwen2, seed=0), tmp_path / "drafter0")
    save_drafter(init_drafter(tiny_qwen2, seed=1), tmp_path / "harvest" / "drafter_versions" / "v000002")
    with pytest.raises(ValueError, match="pass --resume"):
        HarvestHooks.for_run(str(tiny_qwen2), str(drafter0), tmp_path / "harvest", resume=False)
    hooks, serve = HarvestHooks.for_run(str(tiny_qwen2), str(drafter0), tmp_path / "harvest", resume=True)
    assert hooks.h.version == 2 and serve == tmp_path / "harvest" / "drafter_versions" / "v000002"
