"""`gleanrl proxy` in front of the real SGLang 0.5.23 CPU server (no SD there): responses relayed
unchanged, the feed filled from them, and `gleanrl harvest` beside it follows the policy through a
disk update, captures and trains the drafter; its push is refused clearly (that server has
no drafter)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import pytest

from tests.proxy_util import running_proxy
from tests.serving import wait_until

pytestmark = pytest.mark.sglang
ADMIN = {"Authorization": "Bearer adm"}


def _generate(url: str, ids, **sp) -> httpx.Response:
    body = {
        "input_ids": ids,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, **sp},
    }
    return httpx.post(f"{url}/generate", json=body, timeout=300)


def test_proxy_relays_sglang_and_feeds_the_sidecar(
    restore_weights, sglang_model, sglang_model_b, sglang_tokenizer, tmp_path
):
    server = restore_weights
    ids = [sglang_tokenizer.encode(f"count from {i}:") for i in range(4)]
    with running_proxy(server.url, admin_api_key="adm") as (px, _app):
        greedy = {"input_ids": ids[0], "sampling_params": {"max_new_tokens": 12, "temperature": 0.0}}
        direct, relayed = (httpx.post(f"{u}/generate", json=greedy, timeout=300).json() for u in (server.url, px))
        assert relayed["output_ids"] == direct["output_ids"] and relayed["text"] == direct["text"]
        assert relayed["meta_info"]["finish_reason"] == direct["meta_info"]["finish_reason"]
        with httpx.stream("POST", f"{px}/generate", timeout=300, json=greedy | {"stream": True}) as r:
            lines = [x for x in r.iter_lines() if x.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][5:])["output_ids"][-1] == direct["output_ids"][-1]
        feed = httpx.get(f"{px}/harvest_feed", headers=ADMIN, timeout=30).json()
        assert [r["output_ids"] for r in feed["records"]] == [direct["output_ids"]] * 2
        assert feed["records"][0]["prompt_ids"] == ids[0] and feed["records"][0]["weight_version"] == "default"

        out = tmp_path / "harvest"
        cmd = [
            sys.executable,
            "-m",
            "gleanrl",
            "harvest",
            "--server",
            px,
            "--admin-api-key",
            "adm",
            "--out",
            str(out),
            "--cold",
            "--push-every",
            "2",
            "--drafter-topk",
            "16",
            "--drafter-max-tokens",
            "32",
            "--holdout-every",
            "2",
            "--min-holdout-prompts",
            "2",
            "--min-holdout-samples",
            "2",
            "--confidence-z",
            "0",
            "--mid-step-gain",
            "0.02",
            "--save-every-s",
            "1",
            "--poll-s",
            "0.2",
            "--idle-running",
            "8",
        ]
        logfile = tmp_path / "sidecar.log"
        proc = subprocess.Popen(cmd, stdout=logfile.open("w"), stderr=subprocess.STDOUT, text=True)
        assert wait_until(lambda: (out / "sidecar_state.pt").exists() or proc.poll() is not None, timeout=180)
        for _ in range(3):  # a batch of prompts, n = 2 each, as a GRPO step sends them
            assert _generate(px, ids, n=2).status_code == 200
        resp = httpx.post(
            f"{px}/update_weights_from_disk",
            timeout=300,
            json={"model_path": str(sglang_model_b), "weight_version": "7"},
        )
        assert resp.status_code == 200 and resp.json()["success"], resp.text
        for _ in range(3):
            assert _generate(px, ids, n=2).status_code == 200
        followed = wait_until(lambda: '"weight_version": "default"' in _read(out / "metrics.jsonl"), timeout=240)
        refused = wait_until(lambda: "push refused" in _read(logfile), timeout=240)
        # stop only once the state asserted below is reached: every shard is one harvested record
        harvested = wait_until(lambda: len(list((out / "spool").rglob("*.safetensors"))) >= 10, timeout=240)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        log = _read(logfile)
    assert followed and refused and harvested, log
    assert proc.returncode == 0, log
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == ["default", "7"], log  # followed the disk update
    assert sum(r["harvested"] for r in rows) >= 10 and sum(r["drafter_steps"] for r in rows) > 0, log
    assert list((out / "spool").rglob("*.safetensors"))
    assert "push refused" in log and "serves no EAGLE drafter" in log, log
    assert not any((out / "drafter_versions").glob("v*"))  # a refused push leaves no version behind


def _read(path) -> str:
    return path.read_text() if path.exists() else ""
