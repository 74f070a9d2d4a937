"""Process-group weight pushes over gloo (issue 13, item 5): a trainer process (rank 0) joins the
group the server joins through /init_weights_update_group, as SGLang's `init_custom_process_group`
makes it, and broadcasts a checkpoint's tensors; /update_weights_from_distributed receives and
applies them. Target (per-tensor broadcasts, then a flattened bucket inside a session) and draft;
greedy output equals the pushed weights' reference; a refused push (wrong shape) still completes the
broadcasts and keeps the old weights; destroy leaves the group."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine_util import hf_greedy
from sd_util import random_drafter, trained_drafter
from serving import greedy_ids, post, running_server

PROMPT = "The quick brown fox"
TRAINER = """
import sys, torch, torch.distributed as dist
from pathlib import Path
from safetensors.torch import load_file
from gleanrl.server.weights.process_group import init_custom_process_group
port, flat = sys.argv[1], sys.argv[3] == "flat"
pushes = [sorted(kv for f in sorted(Path(p).glob("*.safetensors")) for kv in load_file(f).items())
          for p in sys.argv[2].split(",")]
pg = init_custom_process_group("gloo", f"tcp://127.0.0.1:{port}", 2, 0, "g")
for named in pushes:
    if flat:
        dist.broadcast(torch.cat([t.contiguous().flatten().view(torch.uint8) for _, t in named]), src=0, group=pg)
    else:
        for _, t in named:
            dist.broadcast(t.contiguous(), src=0, group=pg)
print("trainer done", flush=True)
import os
os._exit(0)  # the server leaves the group on /destroy_weights_update_group; no teardown race at exit here
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(path: Path) -> dict:
    named = sorted(kv for f in sorted(path.glob("*.safetensors")) for kv in load_file(f).items())
    return {
        "names": [n for n, _ in named],
        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in named],
        "shapes": [list(t.shape) for _, t in named],
        "group_name": "g",
    }


def trainer(port: int, paths: list[Path], mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(port), ",".join(map(str, paths)), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def join(url: str, port: int) -> None:
    r = post(
        url,
        "/init_weights_update_group",
        {
            "master_address": "127.0.0.1",
            "master_port": port,
            "rank_offset": 1,
            "world_size": 2,
            "group_name": "g",
            "backend": "gloo",
        },
    )
    assert r.status_code == 200 and r.json()["success"], r.text


def finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "trainer done" in out, err[-2000:]


@pytest.fixture(scope="module")
def hf_b(tiny_qwen2_b):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen2_b, dtype=torch.float32).eval()


@pytest.mark.parametrize("mode", ["each", "flat"])
def test_target_push_over_gloo(tiny_qwen2, tiny_qwen2_b, hf, hf_b, tok, mode, tmp_path):
    ids = tok.encode(PROMPT)
    want_a, want_b = hf_greedy(hf, ids, 10), hf_greedy(hf_b, ids, 10)
    bad = tmp_path / "bad"  # A's tensors with one of the wrong shape: received, then refused
    bad.mkdir()
    from safetensors.torch import save_file

    named = dict(sorted(kv for f in sorted(tiny_qwen2.glob("*.safetensors")) for kv in load_file(f).items()))
    first = next(iter(named))
    save_file({**named, first: torch.zeros(2, 2)}, str(bad / "model.safetensors"))
    fmt = {"load_format": "flattened_bucket"} if mode == "flat" else {}
    with running_server(tiny_qwen2) as url:
        port = free_port()
        proc = trainer(port, [tiny_qwen2_b, bad, tiny_qwen2], mode)
        join(url, port)
        r = post(url, "/update_weights_from_distributed", {**spec(tiny_qwen2_b), "weight_version": "b", **fmt})
        assert r.status_code == 200 and r.json()["success"], r.text
        assert greedy_ids(url, tok.encode(PROMPT))["output_ids"] == want_b
        r = post(url, "/update_weights_from_distributed", {**spec(bad), "weight_version": "bad", **fmt})
        assert r.status_code == 400 and first in r.json()["message"]
        assert greedy_ids(url, tok.encode(PROMPT))["meta_info"]["weight_version"] == "b"
        assert post(url, "/begin_weight_update", {"selector": "target"}).json()["success"]
        assert post(url, "/update_weights_from_distributed", {**spec(tiny_qwen2), "weight_version": "a", **fmt}).json()[
            "success"
        ]
        # staged, not applied yet
        assert greedy_ids(url, tok.encode(PROMPT))["output_ids"] == want_b
        assert post(url, "/end_weight_update", {}).json()["success"]
        out = greedy_ids(url, tok.encode(PROMPT))
        assert out["output_ids"] == want_a and out["meta_info"]["weight_version"] == "a"
        finish(proc)
        assert post(url, "/destroy_weights_update_group", {"group_name": "g"}).json()["success"]
        assert post(url, "/update_weights_from_distributed", spec(tiny_qwen2)).status_code == 400


def test_draft_push_over_gloo(tiny_qwen2, tiny_tokenizer, tok, tmp_path):
    trained = trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path / "trained")
    rand = random_drafter(tiny_qwen2, tmp_path / "random", seed=3)
    with running_server(tiny_qwen2, drafter=str(trained), sd="on") as url:
        fast = greedy_ids(url, tok.encode(PROMPT), 32)
        port = free_port()
        proc = trainer(port, [rand], "each")
        join(url, port)
        r = post(url, "/update_weights_from_distributed", {**spec(rand), "selector": "draft"})
        assert r.status_code == 200, r.text
        finish(proc)
        slow = greedy_ids(url, tok.encode(PROMPT), 32)
        assert slow["output_ids"] == fast["output_ids"]
        assert slow["meta_info"]["spec_accept_length"] < fast["meta_info"]["spec_accept_length"]
        assert post(url, "/destroy_weights_update_group", {"group_name": "g"}).json()["success"]
