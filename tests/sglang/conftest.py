"""Tests against the real SGLang 0.5.23 engine on CPU (marker `sglang`). They need the separate venv
made by `bash scripts/install_sglang_cpu.sh .venv-sglang` (or `scripts/setup.sh --sglang`), and are
skipped, saying so, where it is absent. One SGLang server per session serves the tiny Qwen2 model;
every server started here is stopped (its whole process group) at the end."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sglang_util import SKIP_REASON, SGLangServer, available


@pytest.fixture(autouse=True)
def _need_sglang():
    if not available():
        pytest.skip(SKIP_REASON)


@pytest.fixture(scope="session")
def sglang_model(tmp_path_factory, tiny_qwen2) -> Path:
    """A private copy of the tiny Qwen2 policy for the shared server."""
    if not available():
        pytest.skip(SKIP_REASON)
    return Path(shutil.copytree(tiny_qwen2, tmp_path_factory.mktemp("sglang") / "policy"))


@pytest.fixture(scope="session")
def sglang_server(sglang_model):
    server = SGLangServer(sglang_model)
    yield server
    server.stop()


@pytest.fixture
def restore_weights(sglang_server):
    """Tests that push other weights into the shared server put the original ones back afterwards."""
    yield sglang_server
    if sglang_server.alive():
        resp = sglang_server.post("/update_weights_from_disk", {"model_path": str(sglang_server.model),
                                                                "weight_version": "default"})
        assert resp.status_code == 200, resp.text
