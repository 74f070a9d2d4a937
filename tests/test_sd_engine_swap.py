"""Drafter hot-swap: mid-stream (output unchanged, version changes, acceptance follows the new
drafter), the first drafter on a server started without one, and refused drafters (the old one
keeps serving)."""

from __future__ import annotations

import asyncio
import shutil

import httpx
import pytest

from engine_util import PROMPTS, collect, req, run_all
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from gleanrl.server.protocol import CheckpointError
from gleanrl.tiny import make_tiny_model
from sd_util import random_drafter, trained_drafter
from serving import running_app

NEW = 48


@pytest.fixture(scope="module")
def drafters(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    d = tmp_path_factory.mktemp("swap_drafters")
    bad = d / "bad"
    narrow = make_tiny_model(d / "narrow_target", hidden_size=32, tokenizer=tiny_tokenizer)
    deep = make_tiny_model(d / "deep_target", num_layers=8, tokenizer=tiny_tokenizer)
    bad.mkdir()
    save_drafter(init_drafter(narrow), bad / "hidden")
    save_drafter(init_drafter(deep, aux_layer_ids=[1, 3, 6]), bad / "layers")
    random = random_drafter(tiny_qwen2, d / "random")
    shutil.copytree(random, bad / "corrupt")
    weights = bad / "corrupt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return {
        "random": random,
        "trained": trained_drafter(tiny_qwen2, tiny_tokenizer, d / "trained", new_tokens=NEW),
        "bad": {p.name: p for p in bad.iterdir()} | {"missing": d / "nope"},
    }


@pytest.fixture(scope="module")
def plain(tiny_qwen2):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), sd="off"))
    eng.start()
    prompts = [eng.tokenizer(p)["input_ids"] for p in PROMPTS[:4]]
    yield prompts, run_all(eng, [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts])
    eng.shutdown()


def test_swap_mid_stream_keeps_output_and_changes_version(tiny_qwen2, drafters, plain):
    prompts, ref = plain
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), drafter=str(drafters["random"]), sd="on", num_draft_tokens=4))
    eng.start()

    async def stream():
        loop, ids, versions, swapped = asyncio.get_running_loop(), [], [], False
        async for out in eng.generate(req(prompts[0], max_new_tokens=NEW, ignore_eos=True)):
            ids += out.new_ids
            versions.append((len(ids), out.draft_weight_version, out.spec_verify_ct))
            if not swapped and len(ids) >= 8:
                # pause so that the swap lands mid-stream, deterministically
                await loop.run_in_executor(None, eng.pause, "in_place")
                await loop.run_in_executor(
                    None, lambda: eng.update_weights(str(drafters["trained"]), weight_version="d2", selector="draft")
                )
                eng.resume()
                swapped = True
        return ids, versions, out

    try:
        ids, versions, last = asyncio.run(stream())
        info = eng.info()
    finally:
        eng.shutdown()
    assert ids == ref[0]["ids"]
    assert versions[0][1] == "default" and last.draft_weight_version == "d2"
    seen = [v for _, v, _ in versions]
    first = seen.index("d2")
    assert seen == ["default"] * first + ["d2"] * (len(seen) - first)  # one switch, never back
    assert info["draft_weight_version"] == "d2" and info["draft_model_path"] == str(drafters["trained"])
    (n0, _, ct0) = next(v for v in versions if v[1] == "d2")
    # after the swap the trained drafter's states were rebuilt: it accepts several tokens per pass
    assert (NEW - n0) / (last.spec_verify_ct - ct0) > 1.8


def test_first_drafter_on_a_server_started_without_one(tiny_qwen2, drafters, plain):
    prompts, ref = plain
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), sd="on"))
    eng.start()
    try:
        before = run_all(eng, [req(prompts[1], max_new_tokens=NEW, ignore_eos=True)])[0]
        eng.update_weights(str(drafters["trained"]), selector="draft")
        after = run_all(eng, [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts])
    finally:
        eng.shutdown()
    assert before["out"].spec_verify_ct == 0 and before["out"].draft_weight_version is None
    assert [r["ids"] for r in after] == [r["ids"] for r in ref]
    assert all(r["out"].spec_verify_ct > 0 and r["out"].draft_weight_version == "default" for r in after)


def test_mismatched_or_broken_drafters_are_refused_over_http(tiny_qwen2, drafters, plain):
    prompts, ref = plain
    with running_app(tiny_qwen2, drafter=str(drafters["random"]), sd="on") as (url, app):
        for name, path in drafters["bad"].items():
            r = httpx.post(
                f"{url}/update_weights_from_disk",
                timeout=60,
                json={"model_path": str(path), "selector": "draft", "weight_version": name},
            )
            assert r.status_code == 400 and r.json()["success"] is False, name
            assert "drafter" in r.json()["message"], r.json()["message"]
        info = httpx.get(f"{url}/model_info", timeout=10).json()
        assert info["draft_weight_version"] == "default" and info["draft_model_path"] == str(drafters["random"])
        greedy = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
        out = httpx.post(
            f"{url}/generate", timeout=60, json={"input_ids": prompts[2], "sampling_params": greedy}
        ).json()
        assert out["output_ids"] == ref[2]["ids"]
        meta = out["meta_info"]
        assert meta["spec_verify_ct"] > 0 and meta["draft_weight_version"] == "default"
        assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
        # slime's Sample.SpecInfo
        assert 0 <= meta["spec_accept_token_num"] <= meta["spec_draft_token_num"]
        assert meta["spec_accept_rate"] == pytest.approx(meta["spec_accept_token_num"] / meta["spec_draft_token_num"])
        stats = httpx.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]
        assert stats["avg_spec_accept_length"] >= 1.0
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        # the random drafter's rejections
        assert 'gleanrl:spec_verify_passes{tokens="1"}' in metrics


def test_engine_refuses_with_checkpoint_error(tiny_qwen2, drafters):
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), sd="on"))
    with pytest.raises(CheckpointError, match="hidden size"):
        eng.update_weights(str(drafters["bad"]["hidden"]), selector="draft")
    with pytest.raises(CheckpointError, match="layer"):
        eng.update_weights(str(drafters["bad"]["layers"]), selector="draft")
    assert eng.decoder.drafter is None and eng.info()["draft_weight_version"] is None


def test_draft_swap_lands_mid_request_without_waiting(tiny_qwen2, drafters, plain):
    """Unlike a target update, a drafter swap does not wait for running requests (SD
    is lossless)."""
    prompts, _ = plain
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), drafter=str(drafters["random"]), sd="on"))
    eng.start()

    async def main():
        task = asyncio.create_task(collect(eng, req(prompts[0], max_new_tokens=400, ignore_eos=True)))
        while eng.stats()["generation_tokens_total"] < 5:
            await asyncio.sleep(0.002)
        await asyncio.to_thread(eng.update_weights, str(drafters["trained"]), "d2", "draft")
        return task.done(), await task

    try:
        ref = run_all(eng, [req(prompts[0], max_new_tokens=400, ignore_eos=True)])[0]
        done_at_swap, res = asyncio.run(main())
    finally:
        eng.shutdown()
    assert not done_at_swap and res["ids"] == ref["ids"] and res["out"].draft_weight_version == "d2"


def test_a_drafter_swap_keeps_the_targets_states(tiny_qwen2, drafters, plain):
    """A new drafter that reads the same target layers re-feeds nothing through the target: every
    target forward after the swap feeds at most one verify tree a sequence; the drafter's step
    costs and acceptance evidence are kept; output unchanged."""
    prompts, ref = plain
    eng = Engine(EngineConfig(model_path=str(tiny_qwen2), drafter=str(drafters["random"]), sd="on", num_draft_tokens=4))
    fed: list[int] = []
    runner = eng.scheduler.runner
    forward = runner.forward

    def counting(token_ids, *args, **kwargs):
        fed.append(int(token_ids.shape[0]))
        return forward(token_ids, *args, **kwargs)

    runner.forward = counting
    eng.start()

    async def stream():
        loop, ids, swapped, at = asyncio.get_running_loop(), [], False, None
        async for out in eng.generate(req(prompts[0], max_new_tokens=NEW, ignore_eos=True)):
            ids += out.new_ids
            if not swapped and len(ids) >= 16:
                await loop.run_in_executor(None, eng.pause, "in_place")
                before = (dict(eng.decoder.controller.cost.step), eng.decoder.controller.accept.eagle.tries.sum())
                at = len(fed)
                await loop.run_in_executor(
                    None, lambda: eng.update_weights(str(drafters["trained"]), weight_version="d2", selector="draft")
                )
                after = (dict(eng.decoder.controller.cost.step), eng.decoder.controller.accept.eagle.tries.sum())
                eng.resume()
                swapped = True
        return ids, at, before, after

    try:
        ids, at, before, after = asyncio.run(stream())
    finally:
        eng.shutdown()
    assert ids == ref[0]["ids"]
    assert at is not None and len(fed) > at + 2
    assert max(fed[at:]) <= 1 + 4 * 2  # a tree of two branches of <= 4, never a re-feed
    assert after[0] == before[0] and 0 < after[1] < before[1]  # costs kept, evidence decayed
