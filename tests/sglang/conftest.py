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
def sglang_model(tmp_path_factory) -> Path:
    """A private copy of the task's tiny bootstrap policy, which the shared server serves."""
    if not available():
        pytest.skip(SKIP_REASON)
    from gleanrl.trainer.bootstrap import bootstrap_policy

    return Path(
        shutil.copytree(bootstrap_policy(size="tiny", progress=False), tmp_path_factory.mktemp("sglang") / "policy")
    )


@pytest.fixture(scope="session")
def sglang_tokenizer(sglang_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(sglang_model)


@pytest.fixture(scope="session")
def sglang_model_b(sglang_model, tmp_path_factory) -> Path:
    """A policy checkpoint as the trainer writes one (`save_pretrained`): same layout,
    other weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(sglang_model, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    out = tmp_path_factory.mktemp("sglang") / "policy_b"
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(sglang_model).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def other_arch_model(sglang_model, tmp_path_factory) -> Path:
    """A checkpoint of the other architecture (Qwen2 <-> Llama: q/k/v biases or not) with the
    serving policy's shapes."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    c = json.loads((sglang_model / "config.json").read_text())
    keys = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "max_position_embeddings",
        "eos_token_id",
        "pad_token_id",
    )
    other = Qwen2Config if c["model_type"] == "llama" else LlamaConfig
    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_config(other(**{k: c[k] for k in keys}), dtype=torch.float32)
    out = tmp_path_factory.mktemp("sglang") / "other_arch"
    model.save_pretrained(out, safe_serialization=True)
    return out


class _Shared:
    """One SGLang server for this folder's tests, started on first use and stopped when the run leaves the folder:
    SGLang's CPU scheduler polls, about half a core while idle, which the rest of the suite (and a 2-core machine
    shared with another job) would otherwise pay until the session ends."""

    server: SGLangServer | None = None

    @classmethod
    def get(cls, model: Path) -> SGLangServer:
        if cls.server is None or not cls.server.alive():
            cls.stop()
            cls.server = SGLangServer(model)
        return cls.server

    @classmethod
    def stop(cls) -> None:
        if cls.server is not None:
            cls.server.stop()
            cls.server = None


@pytest.fixture
def sglang_server(sglang_model):
    return _Shared.get(sglang_model)


def pytest_runtest_teardown(item, nextitem):
    # called for this folder's tests only (a conftest's hooks apply below it)
    if nextitem is None or Path(__file__).parent not in Path(nextitem.path).parents:
        _Shared.stop()


def pytest_sessionfinish(session):
    _Shared.stop()


@pytest.fixture
def restore_weights(sglang_server):
    """Tests that push other weights into the shared server put the original ones
    back afterwards."""
    yield sglang_server
    if sglang_server.alive():
        resp = sglang_server.post(
            "/update_weights_from_disk", {"model_path": str(sglang_server.model), "weight_version": "default"}
        )
        assert resp.status_code == 200, resp.text
