"""A truncated safetensors file pushed to stock SGLang kills the whole server (its rollback re-reads
the same broken path); the guard refuses it before anything is sent. Uses its own server, since
this one dies."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from gleanrl.harvest.checkpoint_check import CheckpointMismatch, check_policy_checkpoint
from sglang_util import SGLangServer

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def doomed_server(tiny_qwen2, tmp_path_factory):
    server = SGLangServer(shutil.copytree(tiny_qwen2, tmp_path_factory.mktemp("doomed") / "policy"))
    yield server
    server.stop()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_truncated_checkpoint_kills_sglang_and_the_guard_refuses_it(doomed_server, tiny_qwen2, tmp_path):
    bad = shutil.copytree(tiny_qwen2, tmp_path / "truncated")
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointMismatch, match="truncated"):
        check_policy_checkpoint(bad, doomed_server.model)
    assert _healthy(doomed_server.url) and doomed_server.generate([5, 6, 7], 4)["output_ids"]
    try:
        resp = httpx.post(f"{doomed_server.url}/update_weights_from_disk", json={"model_path": str(bad)}, timeout=120)
        answer = f"HTTP {resp.status_code}: {resp.text[:200]}"
    except httpx.TransportError as exc:
        answer = f"no answer ({type(exc).__name__})"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and doomed_server.alive() and _healthy(doomed_server.url):
        time.sleep(1)
    print(
        f"\n[sglang] truncated push: {answer}; server alive={doomed_server.alive()} "
        f"healthy={_healthy(doomed_server.url)}"
    )
    assert not _healthy(doomed_server.url)
