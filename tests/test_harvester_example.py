"""The drop-in example (a custom RL loop that is not gleanrl's trainer) runs end to end against an
embedded server: rollouts, harvest, idle training, gated drafter pushes, policy pushes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_custom_loop_example_runs(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "custom_loop.py"),
            "--out",
            str(tmp_path),
            "--steps",
            "2",
            "--rollouts",
            "8",
            "--max-new-tokens",
            "48",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    rows, final = lines[:-1], lines[-1]
    assert [r["step"] for r in rows] == [1, 2]
    # cumulative: the drafter trained inside idle windows (a quick step-1 tail may end before
    # the spool fills)
    assert rows[-1]["idle_train_steps"] > 0
    info, pushes = final["model_info"], final["pushes"]
    assert info["weight_version"] == "2"
    pushed = [p["version"] for p in pushes if p["pushed"]]
    assert pushed == list(range(1, len(pushed) + 1))  # monotonic, one per accepted push
    assert all(p["candidate"] > p["serving"] for p in pushes if p["pushed"])
    if pushed:
        assert info["draft_weight_version"] == str(pushed[-1])
        assert Path(info["draft_model_path"]).name == f"v{pushed[-1]:06d}"
