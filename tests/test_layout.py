"""The rollouts' layout on the cores (trainer.layout): replicas pinned to their cores, a prompt's
samples to one replica, and the harvest only on the cores of replicas that have nothing left to run,
pinned there."""

from __future__ import annotations

import os
import threading

import pytest

from gleanrl.clients.rollout import Rollout
from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.harvest.idle import IdleWindow, run_window
from gleanrl.trainer.generate import spread
from gleanrl.trainer.layout import IdleCores, Replicas, core_groups, layout_groups

needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs CPU affinity and two cores"
)


def test_core_groups_split_evenly_and_refuse_impossible_counts():
    assert core_groups([3, 1, 0, 2], 2) == [{0, 1}, {2, 3}]
    assert core_groups([0, 1, 2], 2) == [{0, 1}, {2}]
    assert core_groups([0, 1], 1) == [{0, 1}]
    for bad in (0, 3):
        with pytest.raises(ValueError, match="replicas must be in"):
            core_groups([0, 1], bad)


def test_layout_default_is_one_replica_per_core_for_a_harvest_on_cpu_only():
    cores = len(os.sched_getaffinity(0))
    assert len(layout_groups(0, {}, harvests=True)) == cores
    assert layout_groups(0, {}, harvests=False) == [set(os.sched_getaffinity(0))]  # one, every core
    assert len(layout_groups(0, {"device": "cuda"}, harvests=True)) == 1
    assert len(layout_groups(0, {"backend": "sglang"}, harvests=True)) == 1
    whole = layout_groups(1, {}, harvests=False)
    assert whole == [set(os.sched_getaffinity(0))]
    if cores > 1:  # one server beside a harvester leaves it half the cores
        assert len(layout_groups(1, {}, harvests=True)[0]) == cores // 2


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_idle_cores_names_a_replica_only_once_it_settled_while_another_runs():
    flights = {"a": 0, "b": 0}
    clock = Clock()
    idle = IdleCores(flights.__getitem__, {"a": {0}, "b": {1}}, settle_s=0.02, clock=clock)
    assert idle() is None  # between steps: nothing runs, no tail to glean
    flights.update(a=3, b=1)
    assert idle() is None  # both decode
    flights["b"] = 0
    assert idle() is None  # b just finished: not settled yet
    clock.t += 0.03
    assert idle() == {1}  # b idle while a still decodes its tail
    flights["b"] = 1  # b got work again (a re-submission): b's core is its
    assert idle() is None
    flights.update(a=0, b=0)
    clock.t += 1.0
    assert idle() is None  # the step ended: nothing to glean beside
    flights["a"] = 2  # the next step starts: b idle since now, not since
    assert idle() is None  # the last step


@needs_affinity
def test_gated_window_runs_only_on_free_cores_pinned_and_restores_the_thread():
    free: list[set[int] | None] = [None]
    seen: list[set[int]] = []
    before = os.sched_getaffinity(0)
    target = {sorted(before)[-1]}

    def step():
        seen.append(os.sched_getaffinity(0))
        if len(seen) == 3:
            free[0] = None  # the replica got work: the window must wait
            stop.set()

    stop = threading.Event()
    calls = [0]

    def gate():
        calls[0] += 1
        if calls[0] == 5:  # after 4 refusals a core frees up
            free[0] = target
        return free[0]

    report = run_window(step, lambda: not (stop.is_set() and calls[0] > 8), cores=gate)
    assert seen == [target] * 3  # every micro-step on the free core, none before it
    assert report.steps == 3 and report.free_s >= report.busy_s > 0
    assert os.sched_getaffinity(0) == before  # the caller's thread is given back its cores


@needs_affinity
def test_background_window_pins_its_own_thread_only():
    before = os.sched_getaffinity(0)
    target = {sorted(before)[0]}
    seen = []
    window = IdleWindow(lambda: seen.append(os.sched_getaffinity(0)) or True, max_steps=2, cores=lambda: target)
    with window:
        while window._thread.is_alive():
            window._thread.join(0.05)
    assert seen == [target, target] and os.sched_getaffinity(0) == before


def test_spread_deals_groups_out_in_turn_and_keeps_a_group_together():
    rollouts = [Rollout(prompt_ids=[1, 2], group_id=g, index=0, sample={}) for g in (7, 7, 3, 3, 5, 5)]
    client = RolloutClient(["http://a:1", "http://b:2"])
    urls = spread(client, rollouts)
    assert urls == {7: "http://a:1", 3: "http://b:2", 5: "http://a:1"}
    assert spread(RolloutClient(["http://a:1"]), rollouts) == {}
    routed = RolloutClient(["http://a:1", "http://b:2"], router="http://r:3")
    assert spread(routed, rollouts) == {}


@needs_affinity
def test_replicas_run_pinned_to_their_cores(tiny_qwen2, tmp_path):
    """Two real servers, each on its own core; both serve, and a dead one is restarted."""
    import httpx

    from gleanrl.demo_setup import wait_healthy

    groups = core_groups(sorted(os.sched_getaffinity(0))[:2], 2)
    servers = Replicas(str(tiny_qwen2), groups, {"sd": "off"}, log_path=tmp_path / "server.log")
    try:
        servers.start()
        for s in servers.servers:
            wait_healthy(s)
        assert [os.sched_getaffinity(s.proc.pid) for s in servers.servers] == groups
        assert {p.name for p in tmp_path.iterdir()} >= {"server.0.log", "server.1.log"}
        for url in servers.urls:
            out = httpx.post(
                f"{url}/generate",
                json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
                timeout=60,
            ).json()
            assert len(out["output_ids"]) == 2
        servers.servers[1].proc.kill()
        servers.servers[1].proc.wait()
        assert not servers.alive() and servers.ensure_running()
        wait_healthy(servers.servers[1])
        assert os.sched_getaffinity(servers.servers[1].proc.pid) == groups[1]
    finally:
        servers.stop()


@needs_affinity
def test_train_lays_rollouts_on_replicas_and_gates_the_harvest(tiny_qwen2, tmp_path):
    """`gleanrl train` without --server, harvesting: one replica per core by default; the hooks get
    the gate over both replicas' cores, and no start-up check of a harvester beside a busy server
    runs."""
    from gleanrl.trainer.hooks import NoHooks
    from gleanrl.trainer.loop import train
    from test_train import ToyTask, _cfg

    class GateHooks(NoHooks):
        harvests = True
        gate = None
        probes = 0

        def bind_cores(self, cores):
            self.gate = cores

        def scheduling_probe(self):
            self.probes += 1
            return IdleWindow(lambda: True)

    hooks = GateHooks()
    row = train(_cfg(tiny_qwen2, tmp_path / "run", server_wait_s=300), task=ToyTask(), hooks=hooks, log=lambda *a: None)
    assert row["step"] == 2 and hooks.probes == 0
    assert isinstance(hooks.gate, IdleCores)
    assert list(hooks.gate.cores.values()) == core_groups(sorted(os.sched_getaffinity(0)), 2)
    assert {p.name for p in (tmp_path / "run").iterdir()} >= {"server.0.log", "server.1.log"}
