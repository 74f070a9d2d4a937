"""The ragged model runner against transformers' own forward: logits, captured hidden states
(the EAGLE-3 aux streams), pooled decode batches and chunked prefill."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_util import hf_greedy, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.model.kv_pool import KVPool, decode_plan
from gleanrl.server.model.runner import ModelRunner


@pytest.mark.parametrize("arch", ["tiny_qwen2", "tiny_qwen3"])
def test_ragged_forward_and_capture_match_transformers(arch, request):
    path = request.getfixturevalue(arch)
    runner = ModelRunner.load(str(path))
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.vocab_size, (3, 12), generator=g)
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
    pool = KVPool.for_runner(runner, slots=4, capacity=64)
    for buf in pool.k + pool.v:
        # what uninitialised memory may hold: masked positions must not leak it
        buf.fill_(float("nan"))
    # own (growing) and pooled
    caches = [runner.new_cache(capacity=2), pool.acquire(), pool.acquire()]
    layers = [-1, 1, 2]  # -1: the embedding output (the stream entering layer 0)
    for chunk in ([5, 9, 8], [6, 2, 1], [0, 1, 1], [1, 0, 0]):
        # ragged prefill, mixed, pooled decode, own
        live = [b for b in range(3) if chunk[b] > 0]
        starts = [caches[b].length for b in live]
        tok = torch.cat([ids[b, s : s + chunk[b]] for b, s in zip(live, starts)])
        pos = torch.cat([torch.arange(s, s + chunk[b]) for b, s in zip(live, starts)])
        pooled = decode_plan([caches[b] for b in live], [chunk[b] for b in live]) is not None
        assert pooled == (chunk == [0, 1, 1])
        logits, aux = runner.forward(
            tok, pos, [caches[b] for b in live], [chunk[b] for b in live], capture_layers=layers, last_only=False
        )
        want = torch.cat([ref.logits[b, s : s + chunk[b]] for b, s in zip(live, starts)])
        hs = ref.hidden_states  # hs[i] = the stream entering layer i
        want_aux = torch.cat(
            [torch.cat([hs[a + 1][b, s : s + chunk[b]] for a in layers], -1) for b, s in zip(live, starts)]
        )
        torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(aux, want_aux, atol=1e-4, rtol=1e-4)
    assert [c.length for c in caches] == [12, 12, 10]
    with pytest.raises(ValueError, match="capture_layers"):
        runner.forward(ids[0, :2], torch.arange(2), [runner.new_cache()], [2], capture_layers=[0, 1, 3])


def test_chunked_prefill_equals_transformers(tiny_llama):
    # prompts of ~40 tokens prefill over several iterations, beside decodes
    eng = Engine(EngineConfig(model_path=str(tiny_llama), chunked_prefill_size=7))
    assert eng.decoder.pacer.chunk == 7
    eng.start()
    try:
        prompts = [eng.tokenizer("The quick brown fox jumps over the lazy dog. " * k)["input_ids"] for k in (1, 3, 4)]
        res = run_all(eng, [req(p, max_new_tokens=10, ignore_eos=True) for p in prompts])
        model = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
        for p, r in zip(prompts, res):
            assert len(p) > 7 and r["ids"] == hf_greedy(model, p, 10)
        assert eng.decoder.counters.iterations >= sum(map(len, prompts)) / 7  # 7 prompt tokens an iteration
    finally:
        eng.shutdown()


def test_unsupported_models_are_refused(tiny_qwen2):
    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    hf.config.use_sliding_window = True
    with pytest.raises(ValueError, match="sliding-window"):
        ModelRunner(hf)
    hf.config.use_sliding_window = False
    del hf.model.rotary_emb
    with pytest.raises(ValueError, match="not supported"):
        ModelRunner(hf)


def test_float32_fused_weights_held_transposed_and_updated_in_place(tiny_llama):
    # float32 on the CPU: the fused q/k/v and gate/up weights are held [in, out] (packed_linear.transposed_layout), the
    # modules' weights views into them, so an in-place update reaches the runner; bf16 keeps [out, in]
    bf16 = ModelRunner.load(str(tiny_llama), dtype="bfloat16").layers[0].self_attn.q_proj.weight
    assert bf16.stride()[0] != 1
    runner = ModelRunner.load(str(tiny_llama), dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    layer = runner.layers[0]
    for lin in (layer.self_attn.q_proj, layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
        assert lin.weight.stride()[0] == 1
    ids = torch.randint(0, runner.vocab_size, (9,), generator=torch.Generator().manual_seed(0))

    def logits() -> torch.Tensor:
        out, _ = runner.forward(ids, torch.arange(9), [runner.new_cache()], [9], last_only=False)
        return out

    before = logits()
    with torch.no_grad():
        for model in (runner.model, hf):
            model.model.layers[0].self_attn.v_proj.weight.mul_(3.0)
            model.model.layers[0].mlp.up_proj.weight.mul_(-2.0)
        want = hf(ids[None]).logits[0]
    after = logits()
    assert not torch.allclose(before, after, atol=1e-2)
    torch.testing.assert_close(after, want, atol=1e-4, rtol=1e-4)
