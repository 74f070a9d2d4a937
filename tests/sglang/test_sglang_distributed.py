"""The process-group weight push (NCCL on GPUs) run for real against SGLang on CPU with gloo: the trainer
joins SGLang's /init_weights_update_group as rank 0 and broadcasts a policy checkpoint's tensors into a
`selector: "target"` session; SGLang then serves those weights with the new version."""
from __future__ import annotations

import httpx
import pytest
import torch
from safetensors.torch import load_file
from sglang_util import free_port
from test_sglang_weights import _greedy, _hf_greedy

from gleanrl.clients.sglang_dist import close_weight_group, open_weight_group, push_over_group

pytestmark = pytest.mark.sglang


def test_policy_push_over_a_gloo_weight_group(restore_weights, sglang_model_b, sglang_tokenizer):
    server, ids = restore_weights, sglang_tokenizer.encode("12+30=")
    named = sorted(load_file(sglang_model_b / "model.safetensors").items())
    group = open_weight_group(server.url, "127.0.0.1", free_port(), world_size=2, backend="gloo", timeout_s=120)
    try:
        answers = push_over_group(server.url, group, named, "target", weight_version="dist-1", flush_cache=True)
    finally:
        close_weight_group(server.url, group)
    assert all(a["success"] for a in answers)
    assert _greedy(server, ids) == _hf_greedy(sglang_model_b, ids)
    assert httpx.get(f"{server.url}/model_info", timeout=10).json()["weight_version"] == "dist-1"
    assert not torch.distributed.is_initialized()      # nothing left behind in the test process
