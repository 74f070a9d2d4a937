"""Target weight updates: a good checkpoint swaps in (outputs and version change, also mid-stream);
bad ones are refused with the reason and the old weights and version keep serving."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from transformers import AutoModelForCausalLM

from engine_util import collect, hf_greedy, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.protocol import CheckpointError


@pytest.fixture()
def engine(tiny_qwen2):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2)))
    eng.start()
    yield eng
    eng.shutdown()


def _greedy(engine, ids, n=16):
    return run_all(engine, [req(ids, max_new_tokens=n, ignore_eos=True)])[0]


def test_update_changes_outputs_and_version(engine, tiny_qwen2, tiny_qwen2_b):
    ids = engine.tokenizer("Hello, world!")["input_ids"]
    before = _greedy(engine, ids)
    assert before["out"].weight_version == "default" and engine.info()["weight_version"] == "default"
    engine.update_weights(str(tiny_qwen2_b), weight_version="v2")
    after = _greedy(engine, ids)
    expected = hf_greedy(AutoModelForCausalLM.from_pretrained(tiny_qwen2_b).eval(), ids, 16)
    assert after["ids"] == expected and after["ids"] != before["ids"]
    assert after["out"].weight_version == "v2"
    assert engine.info()["weight_version"] == "v2" and engine.info()["model_path"] == str(tiny_qwen2_b)
    engine.update_weights(str(tiny_qwen2))  # no version given: keeps the current one (SGLang)
    assert _greedy(engine, ids)["ids"] == before["ids"] and engine.info()["weight_version"] == "v2"


def test_update_mid_stream_continues_with_new_weights(engine, tiny_qwen2_b):
    ids = engine.tokenizer("The quick brown fox")["input_ids"]
    r = req(ids, max_new_tokens=30, ignore_eos=True)

    async def main():
        task = asyncio.create_task(collect(engine, r))
        while engine.stats()["generation_tokens_total"] < 5:
            await asyncio.sleep(0.002)
        engine.pause("in_place")
        done_before = list(engine.state.running[0].output_ids)
        await asyncio.to_thread(engine.update_weights, str(tiny_qwen2_b), "v2")
        engine.resume()
        return done_before, await task

    done_before, res = asyncio.run(main())
    k = len(done_before)
    assert 0 < k < 30 and res["ids"][:k] == done_before
    model_b = AutoModelForCausalLM.from_pretrained(tiny_qwen2_b).eval()
    assert res["ids"][k:] == hf_greedy(model_b, ids + done_before, 30 - k)
    assert res["out"].weight_version == "v2"


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _truncated(src, tmp_path):
    d = _copy(src, tmp_path / "truncated")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    return d


def _corrupt(src, tmp_path):
    d = _copy(src, tmp_path / "corrupt")
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    return d


def _nan_data(src, tmp_path):
    d = _copy(src, tmp_path / "nan")
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-4000:] = b"\xff" * 4000  # float32 0xffffffff is NaN; the header stays intact
    f.write_bytes(bytes(data))
    return d


def _no_weights(src, tmp_path):
    d = _copy(src, tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    return d


def _other_shapes(src, tmp_path):
    from gleanrl.tiny import make_tiny_model

    return make_tiny_model(tmp_path / "wide", arch="qwen2", hidden_size=32)


@pytest.mark.parametrize(
    "bad, reason",
    [
        (lambda src, tmp: tmp / "missing", "not a directory"),
        (_truncated, "truncated"),
        (_corrupt, "corrupt"),
        (_nan_data, "NaN"),
        (_no_weights, "no .safetensors"),
        (_other_shapes, "expected"),
        ("tiny_llama", "architectures"),
    ],
)
def test_refused_update_keeps_old_weights(engine, tiny_qwen2, tmp_path, request, bad, reason):
    ids = engine.tokenizer("def add(a, b):")["input_ids"]
    engine.update_weights(str(tiny_qwen2), weight_version="v1")
    before = _greedy(engine, ids)
    path = request.getfixturevalue(bad) if isinstance(bad, str) else bad(tiny_qwen2, tmp_path)
    with pytest.raises(CheckpointError, match=reason):
        engine.update_weights(str(path), weight_version="v-bad")
    after = _greedy(engine, ids)
    assert after["ids"] == before["ids"] and after["out"].weight_version == "v1"
    assert engine.info()["weight_version"] == "v1" and engine.info()["model_path"] == str(tiny_qwen2)


def test_target_checkpoint_refused_as_drafter(engine, tiny_qwen2_b):
    with pytest.raises(CheckpointError):
        engine.update_weights(str(tiny_qwen2_b), selector="draft")
    with pytest.raises(CheckpointError, match="selector"):
        engine.update_weights(str(tiny_qwen2_b), selector="both")
    assert engine.info()["weight_version"] == "default"


def test_a_checkpoint_of_another_float_dtype_is_cast_at_load(engine, tiny_qwen2_b, tmp_path):
    """A float32 push updates a model shipped in bf16 (and the other way): floats are cast to the
    serving dtype at load, as SGLang does; the served outputs are those of the cast weights."""
    import torch

    half = shutil.copytree(tiny_qwen2_b, tmp_path / "b_bf16")
    AutoModelForCausalLM.from_pretrained(tiny_qwen2_b, dtype=torch.bfloat16).save_pretrained(half)
    ids = engine.tokenizer("Hello, world!")["input_ids"]
    engine.update_weights(str(half), weight_version="bf16")
    served = _greedy(engine, ids)
    expected = hf_greedy(AutoModelForCausalLM.from_pretrained(half, dtype=torch.float32).eval(), ids, 16)
    assert served["ids"] == expected and engine.info()["weight_version"] == "bf16"
