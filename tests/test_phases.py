"""Phase thread settings: the update's threads and cores are applied inside the phase and restored
after it, also when it raises; the config refuses bad values by name."""

from __future__ import annotations

import os

import pytest
import torch

from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.phases import all_cores, phase_threads

pinning = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")


def test_threads_applied_and_restored():
    before = torch.get_num_threads()
    with phase_threads(before + 2):
        assert torch.get_num_threads() == before + 2
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"):
        with phase_threads(before + 1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be >= 1"):
        with phase_threads(0):
            pass


@pinning
def test_cores_applied_and_restored():
    before, machine = os.sched_getaffinity(0), all_cores()
    assert before <= machine and os.sched_getaffinity(0) == before  # asking does not change the pin
    one = {min(before)}
    with phase_threads(1, one):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == before
    # pinned as the demo pins the trainer: the update gets the whole machine
    os.sched_setaffinity(0, one)
    try:
        with phase_threads(len(machine), machine):
            assert os.sched_getaffinity(0) == machine and torch.get_num_threads() == len(machine)
        assert os.sched_getaffinity(0) == one
    finally:
        os.sched_setaffinity(0, before)


def test_config_checks_update_settings(tiny_qwen2, tmp_path):
    cfg = TrainConfig(model=str(tiny_qwen2), out=str(tmp_path), update_threads=2, update_cores=(0, 1))
    assert cfg.update_cores == [0, 1]
    with pytest.raises(ValueError, match="update_threads"):
        TrainConfig(model=str(tiny_qwen2), out=str(tmp_path), update_threads=-1)
    with pytest.raises(ValueError, match="update_cores"):
        TrainConfig(model=str(tiny_qwen2), out=str(tmp_path), update_cores=[-1])
