"""The lean decode step (compact slot pool, no-gather decode view, fused norms and rotary, packed
bf16 linears) against transformers: greedy identity at batch 1, 8 and 64 with mixed prompt and
output lengths (sequences finish mid-batch, so slots move), stop strings and penalties; and the
pool's compaction. In bfloat16 only batch 1 is compared: bf16 matmuls round differently at different
batch sizes (oneDNN picks other kernels), so a batched greedy decode may flip a near-tie there, in
transformers as in SGLang; the main branch before the lean step differed from transformers at batch
8 in the same place."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor

from engine_util import PROMPTS, hf_greedy, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.model.kv_pool import KVPool, decode_plan
from gleanrl.server.model.runner import ModelRunner


def _batch(tok, b: int) -> tuple[list[list[int]], list[int]]:
    prompts = [tok(PROMPTS[i % len(PROMPTS)] * (1 + i % 3))["input_ids"] for i in range(b)]
    return prompts, [3 + (7 * i) % 22 for i in range(b)]  # 3..24 new tokens: many finish mid-batch


def _served(path, dtype: str):
    eng = Engine(EngineConfig(model_path=str(path), max_running_requests=64, dtype=dtype))
    eng.start()
    return eng, AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


@pytest.fixture(scope="module")
def served(tiny_llama):
    eng, hf = _served(tiny_llama, "float32")
    yield eng, hf
    eng.shutdown()


def _check_greedy(eng, hf, b: int) -> None:
    prompts, lengths = _batch(eng.tokenizer, b)
    res = run_all(eng, [req(p, max_new_tokens=n, ignore_eos=True) for p, n in zip(prompts, lengths)])
    for p, n, r in zip(prompts, lengths, res):
        assert r["ids"] == hf_greedy(hf, p, n)
    assert eng.scheduler.pool is not None and not eng.scheduler.pool.owner  # every slot came back


@pytest.mark.parametrize("b", [1, 8, 64])
def test_greedy_equals_transformers_mixed_batch(served, b):
    _check_greedy(*served, b)


def test_bf16_greedy_equals_transformers_at_batch_1(tiny_llama):
    eng, hf = _served(tiny_llama, "bfloat16")
    try:
        _check_greedy(eng, hf, 1)
    finally:
        eng.shutdown()


class OutputFrequencyPenalty(LogitsProcessor):
    """SGLang's frequency penalty: counts over output tokens only (transformers' own counts
    the prompt)."""

    def __init__(self, prompt_len: int, penalty: float):
        self.prompt_len, self.penalty = prompt_len, penalty

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores).scatter_add_(
            -1, input_ids[:, self.prompt_len :], torch.ones_like(input_ids[:, self.prompt_len :], dtype=scores.dtype)
        )
        return scores - self.penalty * counts


def test_penalties_and_stop_strings_in_a_batch(served):
    eng, hf = served
    tok = eng.tokenizer
    prompts, lengths = _batch(tok, 16)
    plain = [hf_greedy(hf, p, 20) for p in prompts]
    # text the greedy output produces, so it must stop there
    stops = [tok.decode(ids[4:6]) for ids in plain]
    reqs = [
        req(p, max_new_tokens=20, ignore_eos=True, frequency_penalty=0.7)
        if i % 2
        else req(p, max_new_tokens=20, ignore_eos=True, stop=[stops[i]])
        for i, p in enumerate(prompts)
    ]
    for i, (p, r) in enumerate(zip(prompts, run_all(eng, reqs))):
        if i % 2:
            with torch.no_grad():
                want = hf.generate(
                    torch.tensor([p]),
                    max_new_tokens=20,
                    min_new_tokens=20,
                    do_sample=False,
                    logits_processor=[OutputFrequencyPenalty(len(p), 0.7)],
                )[0, len(p) :].tolist()
            assert r["ids"] == want
        else:
            assert r["finish_reason"]["type"] == "stop" and stops[i] in tok.decode(r["ids"])
            assert r["ids"] == plain[i][: len(r["ids"])] and stops[i] not in tok.decode(r["ids"][:-1])


def test_pool_stays_compact_and_moved_caches_keep_their_kv(tiny_llama):
    runner = ModelRunner.load(str(tiny_llama))
    pool = KVPool.for_runner(runner, slots=4, capacity=64)
    caches = [pool.acquire() for _ in range(4)]
    assert [c.slot for c in caches] == [0, 1, 2, 3]
    for i, c in enumerate(caches):
        runner.forward(torch.arange(5 + i), torch.arange(5 + i), [c], [5 + i])
    kept = [c.k[0][:, : c.length].clone() for c in caches]
    pool.release(caches[1])  # the highest slot's cache moves down into the hole
    assert caches[3].slot == 1 and sorted(pool.owner) == [0, 1, 2]
    assert torch.equal(caches[3].k[0][:, : caches[3].length], kept[3])
    plan = decode_plan([caches[2], caches[0], caches[3]], [1, 1, 1])  # slots 2, 0, 1
    assert plan.base == 0 and plan.order.tolist() == [1, 2, 0] and plan.back.tolist() == [2, 0, 1]
    assert pool.acquire().slot == 3  # the lowest free slot


def test_only_the_decode_thread_runs_intra_op_threads(tiny_llama):
    """libgomp throttles every team once a process has more OpenMP threads than CPUs
    (server/engine/loop.py): the decode thread keeps the engine's thread count, a weight update on
    another thread loads with one."""
    import threading

    eng = Engine(EngineConfig(model_path=str(tiny_llama), num_threads=2))
    seen: list[int] = []
    plain_decode = eng.decoder.decode

    def decode(runner, seqs):
        seen.append(torch.get_num_threads())
        return plain_decode(runner, seqs)

    eng.decoder.decode = decode
    eng.start()
    try:
        prompt = eng.tokenizer(PROMPTS[0])["input_ids"]
        run_all(eng, [req(prompt, max_new_tokens=3, ignore_eos=True)])
        loader: list[int] = []

        def update():
            loader.append(torch.get_num_threads())
            eng.update_weights(str(tiny_llama), weight_version="v2")

        worker = threading.Thread(target=update)
        worker.start()
        worker.join()
        run_all(eng, [req(prompt, max_new_tokens=3, ignore_eos=True)])
        assert loader == [1] and seen and set(seen) == {2} and eng.state.weight_version == "v2"
    finally:
        eng.shutdown()


def test_pooled_verify_pass_equals_own_caches(tiny_llama):
    """A verify pass (a few tokens a sequence, a tree mask on one) over pooled caches writes in
    place and attends over a view of the pool; the logits and the caches equal those of
    per-sequence caches."""
    from gleanrl.server.model.verify_attention import verify_plan

    runner = ModelRunner.load(str(tiny_llama))
    pool = KVPool.for_runner(runner, slots=3, capacity=64)
    pooled_caches, own = [pool.acquire() for _ in range(3)], [runner.new_cache(capacity=4) for _ in range(3)]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, runner.vocab_size, (n,), generator=g) for n in (7, 12, 9)]
    for caches in (pooled_caches, own):
        for c, p in zip(caches, prompts):
            runner.forward(p, torch.arange(len(p)), [c], [len(p)])
    lens = [3, 2, 4]
    # two branches
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    masks = [None, None, tree]
    tokens = torch.randint(0, runner.vocab_size, (sum(lens),), generator=g)
    positions = torch.cat([torch.arange(len(p), len(p) + t) for p, t in zip(prompts, lens)])
    order = [2, 0, 1]  # a batch not in slot order
    assert (
        verify_plan(
            [pooled_caches[i] for i in order],
            [lens[i] for i in order],
            [masks[i] for i in order],
            1,
            torch.device("cpu"),
        ).pool
        is pool
    )
    out = {}
    for name, caches in (("pooled", pooled_caches), ("own", own)):
        segs = torch.tensor(lens).cumsum(0)
        pick = torch.cat([torch.arange(int(segs[i]) - lens[i], int(segs[i])) for i in order])
        logits, _ = runner.forward(
            tokens[pick],
            positions[pick],
            [caches[i] for i in order],
            [lens[i] for i in order],
            last_only=False,
            tree_masks=[masks[i] for i in order],
        )
        out[name] = logits
    torch.testing.assert_close(out["pooled"], out["own"], atol=1e-5, rtol=1e-5)
    for a, b in zip(pooled_caches, own):
        assert a.length == b.length
        torch.testing.assert_close(a.k[1][:, : a.length], b.k[1][:, : b.length])


def test_an_engine_gives_the_callers_thread_count_back(tiny_llama):
    """Engines one after the other in one process (bench rollout's arms) each get the
    caller's count."""
    torch.set_num_threads(2)
    for _ in range(2):
        eng = Engine(EngineConfig(model_path=str(tiny_llama)))
        assert eng.loop.threads == 2 and torch.get_num_threads() == 2
        eng.start()
        eng.shutdown()
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("masked", [False, True])
def test_one_query_attention_in_bf16_is_the_attention(masked):
    """One query per sequence in bf16 takes a doubled query (SDPA's fast case): the output is the
    attention of that query, as in float32, and what a pooled decode batch returns."""
    from gleanrl.server.model.kv import sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g) for s in ((3, 4, 1, 16), (3, 4, 40, 16), (3, 4, 40, 16)))
    mask = (torch.arange(40)[None] < torch.tensor([40, 25, 7])[:, None])[:, None, None]
    mask = mask if masked else None
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = sdpa(*(x.bfloat16() for x in (q, k, v)), attn_mask=mask)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    assert torch.equal(sdpa(q, k, v, attn_mask=mask), ref)  # float32: SDPA's own one-query call
