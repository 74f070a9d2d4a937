"""Idle window: micro-steps run only while waiting, and stop within one micro-step of the close."""

from __future__ import annotations

import threading

import pytest

from gleanrl.harvest.idle import IdleWindow, run_window


def test_callable_window_stops_before_next_step():
    calls: list[int] = []
    in_flight = [3]  # rollouts still running; one finishes per micro-step

    def step():
        calls.append(len(calls))
        in_flight[0] -= 1

    report = run_window(step, lambda: in_flight[0] > 0)
    assert calls == [0, 1, 2] and report.steps == 3
    assert report.busy_s <= report.window_s


def test_event_window_and_max_steps():
    waiting = threading.Event()
    assert run_window(lambda: None, waiting).steps == 0  # closed window: no training at all
    waiting.set()
    assert run_window(lambda: None, waiting, max_steps=5).steps == 5


def test_background_window_preempted_within_one_micro_step():
    """The close lands while micro-step k runs: exactly that step finishes, none starts after it."""
    k = 4
    entered, release = threading.Event(), threading.Event()
    started_after_close: list[int] = []
    steps = [0]
    window = IdleWindow(lambda: None)

    def step():
        steps[0] += 1
        if not window._open.is_set():
            started_after_close.append(steps[0])
        if steps[0] == k:
            entered.set()
            release.wait(10)

    window._step = step
    window.open()
    assert entered.wait(10)
    closer = threading.Thread(target=lambda: (window._open.clear(), release.set()))
    closer.start()
    report = window.close()
    closer.join()
    assert report.steps == k and steps[0] == k and started_after_close == []
    assert not window._thread.is_alive()


def test_background_window_surfaces_errors():
    def step():
        raise ValueError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with IdleWindow(step):
            pass


def test_steps_with_nothing_to_do_are_not_counted():
    calls = [0]

    def step():
        calls[0] += 1
        return False if calls[0] <= 3 else None  # an empty spool for three polls, then work

    report = run_window(step, lambda: calls[0] < 6)
    assert calls[0] == 6 and report.steps == 3


def test_window_thread_runs_at_the_given_nice():
    import os

    seen: list[int] = []

    def step() -> bool:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return True

    IdleWindow(step, max_steps=1, nice=7).open().close()
    IdleWindow(step, max_steps=1).open().close()
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    # absolute; raising it back may be refused
    assert seen[1] == base and (seen[0] == 7 or base > 7)
