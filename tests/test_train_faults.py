"""A rollout server killed mid-step: the trainer restarts it, re-pushes its weights, re-submits the
lost rollouts and trains only on rollouts of the version it believes the server holds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading

from gleanrl.trainer import layout, server_proc
from gleanrl.trainer.hooks import NoHooks
from gleanrl.trainer.loop import train
from test_train import ToyTask, _cfg


class KillServerMidStep(NoHooks):
    """Hooks whose first idle window (rollouts in flight) kills the embedded server
    after `delay_s`."""

    def __init__(self, delay_s: float):
        self.delay_s, self.fired = delay_s, False
        self.finished: list = []

    def on_step_start(self, step, model):
        pass

    def on_rollout_finished(self, rollout):
        self.finished.append((rollout.rid, rollout.weight_version))

    @contextlib.contextmanager
    def idle_window(self):
        timer = None
        if not self.fired:
            self.fired = True
            timer = threading.Timer(self.delay_s, lambda: os.kill(SERVERS[-1].proc.pid, signal.SIGKILL))
            timer.start()
        try:
            yield
        finally:
            if timer:
                timer.join()


SERVERS: list = []


def test_server_killed_mid_step_is_restarted_and_rollouts_resubmitted(tiny_qwen2, tmp_path, monkeypatch):
    class Tracked(server_proc.EmbeddedServer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            SERVERS.append(self)

    monkeypatch.setattr(layout, "EmbeddedServer", Tracked)
    hooks, logs = KillServerMidStep(delay_s=0.1), []
    cfg = _cfg(tiny_qwen2, tmp_path / "run", max_new_tokens=160, steps=2)
    row = train(cfg, task=ToyTask(), hooks=hooks, log=lambda *a: logs.append(" ".join(map(str, a))))
    assert row["step"] == 2
    assert SERVERS[-1].restarts == 1
    assert any("re-submitting" in line for line in logs), logs
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_weight_version"] for r in rows] == ["0", "1"]
    # every rollout handed to the harvester was sampled by the version the trainer expected
    step_of = lambda rid: int(rid.split("-")[0].removeprefix("train"))  # noqa: E731
    assert hooks.finished and all(v == str(step_of(rid) - 1) for rid, v in hooks.finished)
    assert rows[0]["logprob_mismatch"] < 1e-3


class PushForeignWeights(NoHooks):
    """Hooks that, as step `step` starts, make the server serve other weights under another version
    (as if someone else pushed), before the step's rollouts are submitted."""

    def __init__(self, url: str, model_dir: str, step: int):
        self.url, self.model_dir, self.step = url, model_dir, step
        self.finished: list = []

    def on_step_start(self, step, model):
        if step == self.step:
            import httpx

            body = {"model_path": self.model_dir, "weight_version": "99"}
            assert httpx.post(f"{self.url}/update_weights_from_disk", json=body, timeout=60).status_code == 200

    def on_rollout_finished(self, rollout):
        self.finished.append(rollout.weight_version)

    def idle_window(self):
        return contextlib.nullcontext()


def test_rollouts_of_a_foreign_weight_version_are_discarded_and_resampled(tiny_qwen2, tiny_qwen2_b, tmp_path):
    from serving import running_server

    logs: list[str] = []
    with running_server(tiny_qwen2) as url:
        hooks = PushForeignWeights(url, str(tiny_qwen2_b), step=2)
        row = train(
            _cfg(tiny_qwen2, tmp_path / "run", servers=[url]),
            task=ToyTask(),
            hooks=hooks,
            log=lambda *a: logs.append(" ".join(map(str, a))),
        )
    assert row["step"] == 2 and row["rollout_weight_version"] == "1"
    assert any("weight_version 99" in line and "discarded" in line for line in logs), logs
    # nothing of version 99 reached training
    assert hooks.finished and set(hooks.finished) == {"0", "1"}
