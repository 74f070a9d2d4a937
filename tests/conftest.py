"""Shared fixtures: tiny random models made locally (no hub downloads)."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)  # 2-core machines: keep room for the server under test
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from gleanrl.tiny import build_tokenizer

    return build_tokenizer()


def _tiny(tmp_path_factory, tiny_tokenizer, arch: str, **kw):
    from gleanrl.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp(f"tiny_{arch}"), arch=arch, tokenizer=tiny_tokenizer, **kw)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory, tiny_tokenizer):
    return _tiny(tmp_path_factory, tiny_tokenizer, "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen2_b(tmp_path_factory, tiny_tokenizer):
    """Same architecture and shapes as `tiny_qwen2`, other weights (for weight updates)."""
    return _tiny(tmp_path_factory, tiny_tokenizer, "qwen2", seed=1)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory, tiny_tokenizer):
    return _tiny(tmp_path_factory, tiny_tokenizer, "llama")


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory, tiny_tokenizer):
    return _tiny(tmp_path_factory, tiny_tokenizer, "qwen3")


@pytest.fixture(scope="module")
def tok(tiny_qwen2):
    """The server's tokenizer for `tiny_qwen2` (AutoTokenizer on the model directory; it may split
    text differently from the in-memory `tiny_tokenizer` fixture)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen2)


@pytest.fixture(scope="module")
def hf(tiny_qwen2):
    """`tiny_qwen2` loaded by transformers in float32, the reference the server is
    compared against."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()
