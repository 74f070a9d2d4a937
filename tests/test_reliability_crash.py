"""`gleanrl bench crash` in CI size: kill -9 the trainer (with harvest, against a server that
outlives it) while it writes a checkpoint and while it pushes the new policy; each run resumes with
at most the step in flight lost, nothing half-written on disk, the server not paused. (A server
killed mid-step is tests/test_train_faults.py.) Plus: the disk check itself catches a
half-written file."""

from __future__ import annotations

import random
import shutil

from gleanrl.bench.crash import check_disk, crash_run
from gleanrl.bench.serve_process import ServeProcess
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter


def test_kill_9_while_writing_a_checkpoint_and_while_pushing(tiny_qwen2, tmp_path):
    drafter = save_drafter(init_drafter(tiny_qwen2), tmp_path / "drafter0")
    rng = random.Random(0)
    with ServeProcess(str(tiny_qwen2), tmp_path / "server.log", extra=["--drafter", str(drafter), "--sd", "on"]) as s:
        for i, phase in enumerate(("checkpoint", "push")):
            rec = crash_run(i, phase, tmp_path, s.url, str(tiny_qwen2), str(drafter), steps=1, rng=rng)
            print(rec)
            assert not rec["problems"], rec
            assert rec["killed_in"].startswith(("checkpoint", "push")) and rec["metrics_steps"] in ([1], [])


def test_the_disk_check_finds_half_written_files(tiny_qwen2, tmp_path):
    ckpt = tmp_path / "weight_v1"
    shutil.copytree(tiny_qwen2, ckpt)
    weights = next(ckpt.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:500])
    spool = tmp_path / "harvest" / "spool"
    spool.mkdir(parents=True)
    (spool / "0000000001.safetensors").write_bytes(b"\x10\x00")
    problems = check_disk(tmp_path)
    assert any("checkpoint weight_v1" in p for p in problems) and any("spool" in p for p in problems), problems


def test_resume_removes_temporaries_of_interrupted_writes(tmp_path):
    from gleanrl.harvest.spool import Spool
    from gleanrl.trainer.checkpoint import load_latest

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / ".0000000003.safetensors.tmp-abc").write_bytes(b"half")
    (tmp_path / ".weight_v2.tmp-xyz").mkdir()
    (tmp_path / ".weight_v2.tmp-xyz" / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".weight_v1.old-123").mkdir()  # a kill between two renames: the only copy, kept
    Spool(spool)
    assert load_latest(tmp_path) is None
    assert sorted(p.name for p in tmp_path.rglob(".*")) == [".weight_v1.old-123"]
