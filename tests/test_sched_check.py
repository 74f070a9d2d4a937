"""The harvest must not slow the rollouts through the scheduler: the embedded server shares the
trainer's session (autogroup scheduling ranks sessions, not nice values, against each other), and
the loop's start-up check times the server with and without the harvester's kind of compute."""

from __future__ import annotations

import json
import os

from gleanrl.harvest.idle import IdleWindow, busy_step
from gleanrl.trainer import layout, server_proc
from gleanrl.trainer.hooks import NoHooks
from gleanrl.trainer.loop import train
from serving import wait_until
from test_train import ToyTask, _cfg


class ProbingHooks(NoHooks):
    """Hooks that harvest nothing but say they do, with a busy nice-19 probe."""

    harvests = True

    def __init__(self):
        self.probes = 0

    def scheduling_probe(self):
        self.probes += 1
        return IdleWindow(busy_step(size=128), nice=19, name="test-probe")


def test_server_shares_the_trainers_session_and_the_check_is_logged(tiny_qwen2, tmp_path, monkeypatch):
    servers = []

    class Tracked(server_proc.EmbeddedServer):
        def start(self):
            super().start()
            servers.append(self)
            # own process group (Ctrl-C reaches the trainer alone), the trainer's session
            assert os.getpgid(self.proc.pid) == self.proc.pid != os.getpgid(0)
            assert os.getsid(self.proc.pid) == os.getsid(0)

    monkeypatch.setattr(layout, "EmbeddedServer", Tracked)
    hooks, logs = ProbingHooks(), []
    # one server: the harvest shares its cores, so the loop checks what that costs
    row = train(
        _cfg(tiny_qwen2, tmp_path / "run", steps=2, server_wait_s=300, replicas=1),
        task=ToyTask(),
        hooks=hooks,
        log=lambda *a: logs.append(" ".join(map(str, a))),
    )
    assert servers and hooks.probes == 1 and row["step"] == 2
    [line] = [x for x in logs if x.startswith("scheduling check")]
    assert "alone" in line and "beside" in line
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]
    assert first["sched_alone_s"] > 0 and first["sched_beside_s"] > 0
    assert first["sched_slowdown"] == first["sched_beside_s"] / first["sched_alone_s"]
    assert "sched_slowdown" not in rows[1]  # once, at the start


def test_busy_step_window_really_computes():
    # a nice-19 background window computes (on a loaded machine it only takes longer), and close()
    # stops it: every micro-step that ran is in its report
    step, calls = busy_step(size=64), []
    window = IdleWindow(lambda: calls.append(1) or step(), nice=19).open()
    try:
        assert wait_until(lambda: len(calls) >= 3, timeout=300), "the window never computed"
    finally:
        report = window.close()
    assert report.steps == len(calls) >= 3 and report.busy_s > 0
    assert report.window_s >= report.busy_s
    full = IdleWindow(busy_step(size=64), max_steps=3)
    full._run()  # in this thread: runs to max_steps
    assert full.report.steps == 3 and full.report.busy_s > 0


def test_the_warning_names_the_autogroup_and_survives_a_blank_proc_file(tmp_path):
    from gleanrl.trainer.run import _autogroup

    enabled, group = tmp_path / "enabled", tmp_path / "group"
    enabled.write_text("1\n")
    group.write_text("/autogroup-7 nice 0\n")
    assert _autogroup(enabled, group) == "on, this process in /autogroup-7"
    group.write_text("")  # what a container showed CI
    assert _autogroup(enabled, group) == "unknown"
    enabled.write_text("0\n")
    assert _autogroup(enabled, group) == "off"
    assert _autogroup(tmp_path / "missing", group) == "unknown"
