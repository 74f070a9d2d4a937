"""`gleanrl harvest` beside a loop that is not gleanrl's (tests/slime_like_loop.py): the loop trains
a tiny policy against `gleanrl serve --harvest-feed` with SD on and a random drafter; the sidecar
follows each disk update, captures, trains in idle windows and pushes drafter versions; the served
acceptance rises above the random drafter's. Also: resume after kill -9, a clean stop on SIGTERM,
clear refusals."""

from __future__ import annotations

import ast
import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from tests import slime_like_loop
from tests.proxy_util import running_proxy
from tests.serving import running_server, wait_until

ADMIN = {"Authorization": "Bearer adm"}
FAST = [
    "--push-every",
    "3",
    "--drafter-lr",
    "3e-3",
    "--drafter-topk",
    "16",
    "--drafter-max-tokens",
    "48",
    "--max-holdout",
    "8",
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


def sidecar(url: str, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "gleanrl",
        "harvest",
        "--server",
        url,
        "--admin-api-key",
        "adm",
        "--out",
        str(out),
        *FAST,
        *extra,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


def stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> str:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    return out


def served_accept(url: str) -> float:
    """Tokens per verify pass over a fixed batch of the loop's kind of prompts (seeded: the same
    requests for every drafter)."""
    outs = [
        httpx.post(
            f"{url}/generate",
            headers=ADMIN,
            timeout=300,
            json={
                "text": f"count from {20 + i}:",
                "sampling_params": {"max_new_tokens": 48, "temperature": 1.0, "sampling_seed": i},
            },
        ).json()
        for i in range(8)
    ]
    return sum(o["meta_info"]["completion_tokens"] for o in outs) / sum(o["meta_info"]["spec_verify_ct"] for o in outs)


def draft_version(url: str) -> str | None:
    return httpx.get(f"{url}/model_info", timeout=30).json()["draft_weight_version"]


@pytest.fixture(scope="module")
def policy(tiny_qwen2, tmp_path_factory) -> Path:
    """`tiny_qwen2` with its output scaled x6: entropy ~1.8 nats, like an RL policy (the random
    model's near-uniform outputs would make a random drafter accept as well as any)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    out = tmp_path_factory.mktemp("peaked") / "policy"
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(tiny_qwen2).save_pretrained(out)
    return out


@pytest.fixture
def drafter0(policy, tmp_path) -> Path:
    return save_drafter(init_drafter(policy, seed=0), tmp_path / "drafter0")


def test_the_loop_knows_nothing_of_gleanrl():
    tree = ast.parse(Path(slime_like_loop.__file__).read_text())
    imported = {
        a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [ast.alias(n.module or "")])
    }
    assert imported == {"__future__", "concurrent", "pathlib", "httpx", "torch", "transformers"}


def test_sidecar_beside_a_foreign_loop_pushes_better_drafters(policy, drafter0, tmp_path):
    torch.set_num_threads(1)
    with running_server(policy, drafter=str(drafter0), sd="on", harvest_feed=True, admin_api_key="adm") as url:
        start = draft_version(url)
        proc = sidecar(url, tmp_path / "harvest", "--drafter", str(drafter0))
        assert wait_until(
            lambda: (tmp_path / "harvest" / "sidecar_state.pt").exists() or proc.poll() is not None, timeout=120
        ), "the sidecar did not start"
        served_after_push = []

        def on_step(step, outs):
            served_after_push.append(draft_version(url) != start)
            return sum(served_after_push) < 3  # three steps served by a pushed drafter

        history = slime_like_loop.train(url, policy, tmp_path / "loop", steps=30, headers=ADMIN, on_step=on_step)
        # a row is written when the sidecar leaves a version
        metrics = tmp_path / "harvest" / "metrics.jsonl"
        wait_until(
            lambda: metrics.is_file() and f'"weight_version": "{len(history) - 1}"' in metrics.read_text(), timeout=120
        )
        # the server is idle now: let the sidecar push once more for the final policy
        last = draft_version(url)
        wait_until(lambda: draft_version(url) != last, timeout=90)
        log = stop(proc)
        info = httpx.get(f"{url}/model_info", timeout=30).json()
        # A/B on the final policy, same prompts and seeds: the pushed drafter, then the
        # random one put back
        after = served_accept(url)
        httpx.post(
            f"{url}/update_weights_from_disk",
            headers=ADMIN,
            timeout=120,
            json={"model_path": str(drafter0), "weight_version": "random", "selector": "draft"},
        ).raise_for_status()
        before = served_accept(url)
    assert proc.returncode == 0, log
    assert sum(served_after_push) >= 1, f"no drafter was pushed in {len(history)} steps:\n{log[-3000:]}"
    print(
        f"\nserved acceptance length on the final policy: random drafter {before:.3f}, "
        f"pushed drafter v{info['draft_weight_version']} {after:.3f} ({len(history)} loop steps)"
    )
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    print("sidecar CPU share per policy version (of one core):", [round(r["cpu_share"], 2) for r in rows])
    assert after > before + 0.3, (before, after, log[-3000:])
    assert info["weight_version"] == str(len(history))  # the loop's own versions, untouched
    # one row per policy followed (and one for the stop)
    followed = [r["weight_version"] for r in rows]
    assert followed[0] == "default" and followed[-1] == str(len(history)) and rows[-1]["partial"]
    assert [int(v) for v in followed[1:-1]] == sorted(set(int(v) for v in followed[1:-1]))
    assert sum(r["harvested"] for r in rows) >= sum(map(len, history)) // 2 and rows[-1]["drafter_version"] >= 1
    versions = sorted(p.name for p in (tmp_path / "harvest" / "drafter_versions").iterdir())
    assert versions[-1] == f"v{int(info['draft_weight_version']):06d}"
    assert "pver" in log and "gleanrl harvest: stopped" in log


def test_resume_after_kill_9_continues_spool_versions_and_cursor(policy, drafter0, tmp_path):
    out = tmp_path / "harvest"
    with running_server(policy, drafter=str(drafter0), sd="on", harvest_feed=True, admin_api_key="adm") as url:
        # any held-out gain pushes (kept by --resume): the resumed run must push again to show its
        # version numbers continue, and the default gate (0.02 on 8 samples of a well-trained
        # drafter) did not always let it within 20 steps (a CI run, 2026-12-04)
        proc = sidecar(url, out, "--drafter", str(drafter0), "--min-gain", "0", "--mid-step-gain", "0")
        assert wait_until(lambda: (out / "sidecar_state.pt").exists(), timeout=120)
        pushed = lambda: any((out / "drafter_versions").glob("v*"))  # noqa: E731
        slime_like_loop.train(
            url,
            policy,
            tmp_path / "loop",
            steps=20,
            headers=ADMIN,
            on_step=lambda step, outs: not (pushed() and step >= 2),
        )
        # kill -9 only once a save holds what the resume is checked against (a read position)
        assert wait_until(lambda: _saved_cursor(out) > 0, timeout=300), "no save with a read position"
        proc.kill()
        proc.communicate(timeout=60)
        state = torch.load(out / "sidecar_state.pt", weights_only=False)
        versions = sorted(int(p.name[1:]) for p in (out / "drafter_versions").glob("v*"))
        spooled = {p.name for p in (out / "spool").rglob("*.safetensors")}
        fresh = subprocess.run(
            [
                sys.executable,
                "-m",
                "gleanrl",
                "harvest",
                "--server",
                url,
                "--admin-api-key",
                "adm",
                "--out",
                str(out),
                "--drafter",
                str(drafter0),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        # never over an earlier run by accident
        assert fresh.returncode == 2 and "--resume" in fresh.stderr
        again = sidecar(url, out, "--drafter", str(drafter0), "--resume")
        slime_like_loop.train(
            url,
            policy,
            tmp_path / "loop2",
            steps=20,
            headers=ADMIN,
            on_step=lambda step, outs: (
                max(int(p.name[1:]) for p in (out / "drafter_versions").glob("v*")) <= versions[-1]
            ),
        )
        log = stop(again)
        served = httpx.get(f"{url}/model_info", timeout=30).json()["draft_weight_version"]
    assert again.returncode == 0, log
    assert "(resumed)" in log and state["view"]["cursor"] > 0
    after = sorted(int(p.name[1:]) for p in (out / "drafter_versions").glob("v*"))
    # version numbers continue, never repeat
    assert after[-1] > versions[-1] and int(served) == after[-1]
    # the spool is kept
    assert spooled and spooled <= {p.name for p in (out / "spool").rglob("*.safetensors")}
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]  # nothing half-written
    resumed = torch.load(out / "sidecar_state.pt", weights_only=False)
    assert resumed["view"]["cursor"] > state["view"]["cursor"]
    assert resumed["view"]["feed_id"] == state["view"]["feed_id"]


def test_refuses_what_it_cannot_follow(policy, drafter0, tmp_path):
    def harvest(url: str, out: str, key: str = "adm") -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "gleanrl",
                "harvest",
                "--admin-api-key",
                key,
                "--drafter",
                str(drafter0),
                "--server",
                url,
                "--out",
                str(tmp_path / out),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    with running_server(policy) as url:  # feed off
        off = harvest(url, "a")
    assert off.returncode == 2 and "--harvest-feed" in off.stderr and "Traceback" not in off.stderr
    with (
        running_server(policy, harvest_feed=True, admin_api_key="adm") as url,
        running_proxy(url, admin_api_key="adm") as (px, app),
    ):
        wrong = harvest(url, "b", key="nope")
        assert wrong.returncode == 2 and "401" in wrong.stderr and "Traceback" not in wrong.stderr
        app.state.feed.note_weight_update("tensor", "4")  # relayed by the proxy from a GPU trainer
        tensor = harvest(px, "c")
    assert tensor.returncode == 2 and "update_weights_from_tensor" in tensor.stderr, tensor.stderr
    assert "cannot follow" in tensor.stderr and "Traceback" not in tensor.stderr


def _saved(out) -> dict | None:
    """The sidecar's last save (written atomically, so never half a file); None while there is
    none yet, or it cannot be read whole: a waiting predicate waits instead of raising."""
    try:
        return torch.load(out / "sidecar_state.pt", weights_only=False)
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError):
        return None


def _saved_cursor(out) -> int:
    """The feed read position of the sidecar's last save; 0 while there is none."""
    state = _saved(out)
    return state["view"]["cursor"] if state else 0
