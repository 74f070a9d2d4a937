"""Tests of the embedded engine on CUDA (marker `cuda`; scripts/gpu_check.sh runs them on the GPU).
Skipped, saying so, where torch sees no GPU. GLEANRL_TEST_DEVICE=cpu runs the same tests on CPU, as
the GPU check's dry run does, so that they cannot rot on machines without one."""

from __future__ import annotations

import os

import pytest
import torch

SKIP_REASON = "needs CUDA (torch sees no GPU); GLEANRL_TEST_DEVICE=cpu runs these tests on CPU"


@pytest.fixture(scope="session")
def device() -> str:
    want = os.environ.get("GLEANRL_TEST_DEVICE", "cuda")
    if want not in ("cpu", "cuda"):
        raise ValueError(f"GLEANRL_TEST_DEVICE must be cpu or cuda, got {want!r}")
    if want == "cuda" and not torch.cuda.is_available():
        pytest.skip(SKIP_REASON)
    return want


@pytest.fixture(autouse=True)
def _need_device(device):
    """Every test here asks for the device, so each is skipped without one."""
