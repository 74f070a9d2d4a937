"""Weight pushes into a real SGLang server: a trainer checkpoint is accepted by
/update_weights_from_disk and changes outputs and weight_version; the bad pushes stock SGLang
mishandles are reproduced raw, and gleanrl's guard (harvest.checkpoint_check, clients.weight_sync)
refuses each before sending."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from safetensors.torch import load_file

from gleanrl.clients.rollout_client import RolloutClient, tensor_body
from gleanrl.clients.transport import RolloutServerError
from gleanrl.clients.weight_sync import probe, push_drafter, tensor_session
from gleanrl.harvest.checkpoint_check import CheckpointMismatch, check_policy_checkpoint

pytestmark = pytest.mark.sglang
PROMPT = "12+30="


def _ids(tokenizer) -> list[int]:
    return tokenizer.encode(PROMPT)


def _greedy(server, ids, n: int = 12) -> list[int]:
    return server.generate(ids, n, ignore_eos=True)["output_ids"]


def _hf_greedy(model_dir, ids, n: int = 12) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seq = list(ids)
    with torch.no_grad():
        # plain argmax loop: EOS is a candidate like any token, as with ignore_eos
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


def _version(server) -> str:
    return httpx.get(f"{server.url}/model_info", timeout=10).json()["weight_version"]


def _with_client(server, fn):
    async def go():
        async with RolloutClient([server.url]) as client:
            return await fn(client)

    return asyncio.run(go())


def _session(server, selector: str, body: dict) -> list[dict]:
    return _with_client(server, lambda client: tensor_session(client, server.url, selector, body))


def test_trainer_checkpoint_is_accepted_and_changes_outputs_and_version(
    restore_weights, sglang_model_b, sglang_tokenizer
):
    server, ids = restore_weights, _ids(sglang_tokenizer)
    assert _greedy(server, ids) == _hf_greedy(server.model, ids)
    # the guard lets a good checkpoint through
    check_policy_checkpoint(sglang_model_b, server.model)

    async def push():
        async with RolloutClient([server.url]) as client:
            return await client.update_weights_from_disk(str(sglang_model_b), weight_version="step-1")

    assert asyncio.run(push())[0]["success"] is True
    out = server.generate(ids, 12, ignore_eos=True)
    assert out["output_ids"] == _hf_greedy(sglang_model_b, ids) != _hf_greedy(server.model, ids)
    assert out["meta_info"]["weight_version"] == "step-1" == _version(server)


def test_policy_push_by_tensor_session_with_selector_target(restore_weights, sglang_model_b, sglang_tokenizer):
    """The path for policy pushes to an SD server (where /update_weights_from_disk would also hit
    the drafter): begin(selector=target) -> update_weights_from_tensor (tensors by value) -> end."""
    server, ids = restore_weights, _ids(sglang_tokenizer)
    named = sorted(load_file(sglang_model_b / "model.safetensors").items())
    answers = _session(server, "target", tensor_body(named, "target", weight_version="tensor-1", flush_cache=True))
    assert all(a["success"] for a in answers)
    assert _greedy(server, ids) == _hf_greedy(sglang_model_b, ids)
    assert _version(server) == "tensor-1"


def test_other_architecture_is_loaded_by_sglang_but_refused_by_the_guard(
    restore_weights, other_arch_model, sglang_tokenizer
):
    server, ids = restore_weights, _ids(sglang_tokenizer)
    with pytest.raises(CheckpointMismatch, match="architectures"):
        check_policy_checkpoint(other_arch_model, server.model)
    before = _greedy(server, ids)
    resp = server.post(
        "/update_weights_from_disk", {"model_path": str(other_arch_model), "weight_version": "other-arch"}
    )
    assert resp.status_code == 200 and resp.json()["success"] is True  # stock SGLang: "success"
    # ... and now runs mixed weights
    assert _greedy(server, ids) != before and _version(server) == "other-arch"


def test_selector_is_ignored_so_a_drafter_sent_via_disk_lands_in_the_target(
    restore_weights, drafter_for_policy, sglang_tokenizer
):
    server, ids = restore_weights, _ids(sglang_tokenizer)
    with pytest.raises(CheckpointMismatch, match="EAGLE-3 drafter"):
        check_policy_checkpoint(drafter_for_policy, server.model)
    before = _greedy(server, ids)
    resp = server.post(
        "/update_weights_from_disk",
        {"model_path": str(drafter_for_policy), "selector": "draft", "weight_version": "draft-1"},
    )
    print(
        "\n[sglang] drafter via /update_weights_from_disk with selector=draft: "
        f"HTTP {resp.status_code} {resp.text[:200]}"
    )
    assert resp.status_code == 200 and resp.json()["success"] is True
    # the drafter's lm_head replaced the target's
    assert _greedy(server, ids) != before
    assert _version(server) == "draft-1"  # and the policy's version is gone


def test_draft_push_to_a_server_without_drafter_succeeds_raw_and_is_refused_guarded(
    sglang_server, drafter_for_policy, sglang_tokenizer
):
    server, ids = sglang_server, _ids(sglang_tokenizer)
    named = sorted(load_file(drafter_for_policy / "model.safetensors").items())
    before, version = _greedy(server, ids), _version(server)
    answers = _session(server, "draft", tensor_body(named, "draft"))
    assert all(a["success"] for a in answers)  # SGLang: success, nothing loaded
    assert _greedy(server, ids) == before and _version(server) == version
    with pytest.raises(RolloutServerError, match="serves no EAGLE drafter"):
        _with_client(server, lambda client: push_drafter(client, str(drafter_for_policy), 1))
    assert not _with_client(server, lambda client: probe(client, server.url)).embedded


@pytest.fixture(scope="module")
def drafter_for_policy(sglang_model, tmp_path_factory):
    """An EAGLE-3 drafter directory sized for the serving policy (hidden size, vocabulary)."""
    from gleanrl.harvest.checkpoint import save_drafter
    from gleanrl.harvest.drafter import Eagle3Drafter
    from gleanrl.harvest.drafter_config import DrafterConfig

    cfg = json.loads((sglang_model / "config.json").read_text())
    # drafter ids need >= 4 layers
    shaped = {**cfg, "num_hidden_layers": max(4, cfg["num_hidden_layers"])}
    torch.manual_seed(0)
    return save_drafter(Eagle3Drafter(DrafterConfig.for_target(shaped)), tmp_path_factory.mktemp("drafter") / "d")
