"""scripts/measure_sidecar.py (the sidecar figure): its arguments, and its summary and table
(scripts/sidecar_summary.py) over fake steps and fake sidecar metrics rows (the run itself takes
minutes: not run here)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ms():
    """scripts/sidecar_summary.py (the figure's arithmetic)."""
    sys.path.insert(0, str(ROOT / "scripts"))  # the script imports its siblings, as when run
    try:
        return importlib.import_module("sidecar_summary")
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_args():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        script = importlib.import_module("measure_sidecar")
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    args = script.parse_args(
        ["--out", "/tmp/x", "--steps", "3", "--prompts", "2", "--samples", "4", "--harvest-arg=--push-every=5"]
    )
    assert (args.steps, args.prompts, args.samples, args.harvest_arg) == (3, 2, 4, ["--push-every=5"])
    assert script.parse_args(["--out", "o"]).steps == 12
    with pytest.raises(SystemExit):
        script.parse_args(["--out", "o", "--samples", "0"])


def meta(verify: int, accepted: int, tokens: int, dver: str = "default") -> dict:
    return {
        "spec_verify_ct": verify,
        "spec_accept_token_num": accepted,
        "completion_tokens": tokens,
        "draft_weight_version": dver,
    }


def test_served_acceptance(ms):
    acc = ms.served_acceptance([meta(4, 2, 10), meta(6, 8, 30)])
    # (10 passes + 10 accepted) / 10 passes; 40 tokens, 20 of them from verify passes
    assert acc["accept_len"] == 2.0 and acc["sglang_accept_len"] == 4.0
    assert acc["sd_token_share"] == 0.5 and acc["verify_passes"] == 10
    assert ms.served_acceptance([meta(0, 0, 5)])["accept_len"] is None
    by = ms.acceptance_by_drafter([meta(2, 0, 4), meta(2, 2, 4, "1")])
    assert by["default"]["accept_len"] == 1.0 and by["1"]["accept_len"] == 2.0


def test_gate_statuses(ms):
    lines = [
        "[harvest] policy v1 | feed 3 read, 0 missed | captured 2 | drafter steps 3, v0 "
        "| training | held: held-out prompts 2 of the 4 needed",
        "   1       1       0",
        "[harvest] policy v1 | feed 9 read | training | held: held-out prompts 2 of the 4 needed",
        "gleanrl harvest: warning: push refused: HTTPStatusError: 400",
        "[harvest] policy v2 | x | pushed v1: gain +0.300 ± 0.050 tokens/pass",
    ]
    assert ms.gate_statuses(lines) == [
        "held: held-out prompts 2 of the 4 needed",
        "gleanrl harvest: warning: push refused: HTTPStatusError: 400",
        "pushed v1: gain +0.300 ± 0.050 tokens/pass",
    ]


def fake_step(step: int, accept: float, before: str, after: str, gate: list[str]) -> dict:
    verify = 100
    return {
        "step": step,
        "reward": 0.5,
        "rollout_s": 10.0,
        "gate": gate,
        "served": {
            "accept_len": accept,
            "sglang_accept_len": accept * 2,
            "sd_token_share": 0.5,
            "verify_passes": verify,
            "completion_tokens": int(2 * verify * accept),
        },
        "draft_version_before": before,
        "draft_version_after": after,
    }


def test_summary_and_table(ms):
    steps = [
        fake_step(1, 1.0, "default", "default", []),
        fake_step(2, 1.2, "default", "1", ["pushed v1: gain +0.2"]),
        fake_step(3, 1.4, "1", "2", []),
        fake_step(4, 1.6, "2", "2", ["held: gain +0.01"]),
    ]
    rows = [
        {
            "step": 0,
            "weight_version": "default",
            "drafter_version": 0,
            "push_gains": [],
            "push_why": "no push attempt yet",
        },
        {"step": 1, "weight_version": "1", "drafter_version": 1, "push_gains": [[0.2, 0.1]], "push_why": "pushed v1"},
        {"step": 2, "weight_version": "2", "drafter_version": 2, "push_gains": [[0.25, 0.12]], "push_why": "pushed v2"},
        {"step": 3, "weight_version": "3", "drafter_version": 2, "push_gains": [], "partial": True},
    ]
    summary = ms.summarize(steps, rows, {"args": {}})
    assert summary["n_pushes"] == 2
    assert [(p["drafter_version"], p["gain"]) for p in summary["pushes"]] == [(1, 0.2), (2, 0.25)]
    acc = summary["served_accept"]
    assert acc["over_steps"] == 2 and acc["first"] == pytest.approx(1.1)
    assert acc["ratio"] == pytest.approx(1.5 / 1.1)
    assert steps[0]["sidecar"]["push_why"] == "no push attempt yet"
    assert steps[2]["sidecar"]["push_why"] == "pushed v2" and steps[3]["sidecar"] is None
    text = ms.table(summary)
    # a step without a progress line shows the sidecar row's word
    assert "no push attempt yet" in text and "pushes: 2" in text and "x1.364" in text
    assert ms.summarize([], [], {})["served_accept"]["ratio"] is None
