"""Group drafts in the embedded engine: greedy output identical to plain decoding at batch 1, 8 and
64 with identical prompts among the batch, sampled siblings that diverge from the greedy ones,
earlier samples of the same prompts, and a drafter swap mid-stream; stops exact inside accepted
group drafts."""

from __future__ import annotations

import asyncio

import pytest

from engine_util import PROMPTS, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from sd_util import trained_drafter

NEW = 40
ALL = ("eagle", "group", "fused")


def _engine(model, **kw) -> Engine:
    eng = Engine(EngineConfig(model_path=str(model), max_running_requests=64, **kw))
    eng.start()
    return eng


@pytest.fixture(scope="module")
def drafter(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    return trained_drafter(tiny_qwen2, tiny_tokenizer, tmp_path_factory.mktemp("group") / "trained")


@pytest.fixture(scope="module")
def engines(tiny_qwen2, drafter):
    engs = {
        "plain": _engine(tiny_qwen2, sd="off"),
        # on: no plain arm, SD at any batch
        "group": _engine(tiny_qwen2, sd="on", sd_sources=("group",)),
        "fused": _engine(tiny_qwen2, sd="on", drafter=str(drafter), sd_sources=ALL),
    }
    yield engs
    for e in engs.values():
        e.shutdown()


@pytest.fixture(scope="module")
def prompts(engines):
    return [engines["plain"].tokenizer(p)["input_ids"] for p in PROMPTS[:4]]


@pytest.fixture(scope="module")
def reference(engines, prompts):
    return run_all(engines["plain"], [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts])


def _batch(prompts, batch: int):
    """Greedy requests over a few prompts (identical prompts among them) plus sampled siblings of
    the same prompts, whose outputs diverge and still feed the group index. Returns (requests,
    greedy rows)."""
    reqs, greedy = [], []
    for i in range(batch):
        p = i % len(prompts)
        if i % 2 == 0 or batch == 1:
            greedy.append((len(reqs), p))
            reqs.append(req(prompts[p], max_new_tokens=NEW, ignore_eos=True))
        else:
            reqs.append(req(prompts[p], max_new_tokens=NEW, ignore_eos=True, temperature=1.0, seed=i))
    return reqs, greedy


@pytest.mark.parametrize("engine", ["group", "fused"])
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_greedy_identical_with_group_drafts(engines, prompts, reference, engine, batch):
    eng = engines[engine]
    before = dict(eng.decoder.counters.spec_accept_token_num_by_source)
    # the second round drafts from the first's samples
    for _ in range(2):
        reqs, greedy = _batch(prompts, batch)
        res = run_all(eng, reqs)
        for row, p in greedy:
            assert res[row]["ids"] == reference[p]["ids"]
            assert res[row]["logprobs"] == pytest.approx(reference[p]["logprobs"], abs=1e-4)
        assert all(len(r["ids"]) == NEW for r in res)
    assert eng.decoder.counters.spec_accept_token_num_by_source["group"] > before["group"], "none accepted"


def test_greedy_identical_across_a_drafter_swap_mid_stream(tiny_qwen2, drafter, prompts, reference, tmp_path):
    from sd_util import random_drafter

    other = random_drafter(tiny_qwen2, tmp_path / "random")
    eng = _engine(tiny_qwen2, sd="on", drafter=str(other), sd_sources=ALL)

    async def main():
        loop, swapped = asyncio.get_running_loop(), False

        async def one(p):
            nonlocal swapped
            ids = []
            async for out in eng.generate(req(prompts[p], max_new_tokens=NEW, ignore_eos=True)):
                ids += out.new_ids
                if not swapped and len(ids) >= 10:
                    swapped = True
                    await loop.run_in_executor(None, eng.pause, "in_place")
                    await loop.run_in_executor(
                        None, lambda: eng.update_weights(str(drafter), weight_version="d2", selector="draft")
                    )
                    eng.resume()
            return ids, out

        return await asyncio.gather(*[one(i % len(prompts)) for i in range(8)])

    try:
        res = asyncio.run(main())
    finally:
        eng.shutdown()
    assert all(ids == reference[i % len(prompts)]["ids"] for i, (ids, _) in enumerate(res))
    assert {out.draft_weight_version for _, out in res} == {"d2"}
    assert sum((out.spec_accept_token_num_by_source or {}).get("group", 0) for _, out in res) > 0


def test_stops_are_exact_inside_group_drafts(engines, prompts, reference):
    """A finished sibling's output is the group draft; stop ids, stop strings and max_new_tokens
    that fall inside it cut the accepted draft exactly where plain decoding stops."""
    tok, inside = engines["plain"].tokenizer, 0
    for p, ref in zip(prompts, reference):
        out = ref["ids"]
        for params in (dict(stop_token_ids=[out[17]]), dict(stop=[tok.decode(out[21:23])]), dict(max_new_tokens=19)):
            params = dict(dict(max_new_tokens=NEW, ignore_eos=True), **params)
            want = run_all(engines["plain"], [req(p, **params)])[0]
            # a sibling, finished
            run_all(engines["group"], [req(p, max_new_tokens=NEW, ignore_eos=True)])
            got = run_all(engines["group"], [req(p, **params)])[0]
            assert got["ids"] == want["ids"] and got["finish_reason"] == want["finish_reason"]
            assert len(want["ids"]) < NEW
            inside += len(got["out"].new_ids) > 1
    assert inside >= 4, "too few stops fell inside an accepted group draft to test it"


def test_stats_by_source_in_meta_info_server_info_and_metrics(tiny_qwen2, prompts):
    import httpx

    from serving import running_app

    # a fixed draft length: the plan, so the count of accepted tokens, does not depend on
    # measured timings
    with running_app(tiny_qwen2, sd="on", sd_sources=("group",), num_draft_tokens=8) as (url, _):
        body = {
            "input_ids": prompts[0],
            "sampling_params": {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True},
        }
        # an earlier sample
        httpx.post(f"{url}/generate", json=body, timeout=60).raise_for_status()
        meta = httpx.post(f"{url}/generate", json=body, timeout=60).json()["meta_info"]
        info = httpx.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert meta["spec_accept_token_num_by_source"]["group"] == meta["spec_accept_token_num"] > NEW // 2
    assert info["spec_accept_token_num_by_source"]["group"] >= meta["spec_accept_token_num"]
    assert info["avg_spec_accept_length_by_source"]["group"] > 1.0
    assert info["group_index"]["prompts"] == 1 and info["group_index"]["tokens"] >= NEW
    assert (
        f'gleanrl:spec_accept_token_num{{source="group"}} {float(info["spec_accept_token_num_by_source"]["group"])}'
        in metrics
    )
