"""Scale-out on the real sglang-router (the Rust Model Gateway; its wheel runs on CPU): two embedded
servers behind `python -m sglang_router.launch_router`, `gleanrl train --router … --server …
--server …` for two steps. Generation goes through the router to both workers; weight pushes reach
each worker."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest

from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.loop import train
from tests.serving import running_server, server_stats, wait_until
from tests.test_integration_router import LetterTask

pytest.importorskip("sglang_router", reason="sglang-router is in the test extra (pip install sglang-router)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_train_through_the_real_router(tiny_qwen2, tmp_path):
    port = _free_port()
    with running_server(tiny_qwen2) as w1, running_server(tiny_qwen2) as w2:
        log = open(tmp_path / "router.log", "wb")
        router = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--worker-urls",
                w1,
                w2,
                "--policy",
                "round_robin",
                "--log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            assert wait_until(lambda: _healthy(url), timeout=60), (tmp_path / "router.log").read_text()[-2000:]
            before = [server_stats(w)["generation_tokens_total"] for w in (w1, w2)]
            cfg = TrainConfig(
                model=str(tiny_qwen2),
                out=str(tmp_path / "run"),
                servers=[w1, w2],
                router=url,
                steps=2,
                prompts_per_step=2,
                samples_per_prompt=2,
                max_new_tokens=8,
                seed=0,
            )
            row = train(cfg, task=LetterTask(), log=lambda *a: None)
            after = [server_stats(w)["generation_tokens_total"] for w in (w1, w2)]
            versions = [httpx.get(f"{w}/model_info", timeout=30).json()["weight_version"] for w in (w1, w2)]
            routed = httpx.post(
                f"{url}/generate",
                timeout=60,
                json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
            ).json()
        finally:
            router.terminate()
            router.wait(timeout=30)
            log.close()
    assert row["step"] == 2 and versions == ["2", "2"]  # the trainer pushed to each worker
    # both workers generated via the router
    assert all(a > b for a, b in zip(after, before)), (before, after)
    assert routed["meta_info"]["weight_version"] == "2" and len(routed["output_ids"]) == 4
