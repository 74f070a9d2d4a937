"""Weight and drafter swaps on CUDA: a target checkpoint swaps in (outputs follow transformers on
the new weights, version changes), a missing one is refused and the old weights keep serving; a
drafter swapped into an SD engine keeps the output and changes the draft version."""

from __future__ import annotations

import pytest

from cuda_util import hf_greedy, hf_on
from engine_util import PROMPTS, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.protocol import CheckpointError
from sd_util import random_drafter, trained_drafter

pytestmark = pytest.mark.cuda
NEW = 24


def _engine(model, device: str, **kw) -> Engine:
    eng = Engine(EngineConfig(model_path=str(model), device=device, dtype="float32", **kw))
    eng.start()
    return eng


def test_target_swap_and_refusal(tiny_qwen2, tiny_qwen2_b, device, tmp_path):
    eng = _engine(tiny_qwen2, device)
    try:
        ids = eng.tokenizer(PROMPTS[0])["input_ids"]
        before = run_all(eng, [req(ids, max_new_tokens=NEW, ignore_eos=True)])[0]
        eng.update_weights(str(tiny_qwen2_b), weight_version="v2")
        after = run_all(eng, [req(ids, max_new_tokens=NEW, ignore_eos=True)])[0]
        with pytest.raises(CheckpointError):
            eng.update_weights(str(tmp_path / "missing"), weight_version="v3")
        kept = run_all(eng, [req(ids, max_new_tokens=NEW, ignore_eos=True)])[0]
        info = eng.info()
    finally:
        eng.shutdown()
    assert after["ids"] == hf_greedy(hf_on(tiny_qwen2_b, device), ids, NEW) != before["ids"]
    assert after["out"].weight_version == "v2" and kept["out"].weight_version == "v2" == info["weight_version"]
    assert kept["ids"] == after["ids"]


def test_drafter_swap_keeps_output(tiny_qwen2, tiny_tokenizer, device, tmp_path):
    plain = _engine(tiny_qwen2, device, sd="off")
    prompts = [plain.tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    try:
        ref = run_all(plain, [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts])
    finally:
        plain.shutdown()
    eng = _engine(tiny_qwen2, device, sd="on", drafter=str(random_drafter(tiny_qwen2, tmp_path / "random")))
    try:
        eng.update_weights(
            str(trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path / "trained")),
            weight_version="d2",
            selector="draft",
        )
        res = run_all(eng, [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts])
        info = eng.info()
    finally:
        eng.shutdown()
    assert [r["ids"] for r in res] == [r["ids"] for r in ref]
    assert all(r["out"].draft_weight_version == "d2" and r["out"].spec_verify_ct > 0 for r in res)
    assert info["draft_weight_version"] == "d2"
