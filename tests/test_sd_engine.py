"""SD in the embedded engine: greedy output identical to plain decoding at batch 1, 4 and 16 with a
random and a trained drafter, adaptive switching, and exact stops inside accepted drafts."""

from __future__ import annotations

import pytest

from engine_util import PROMPTS, req, run_all
from gleanrl.server.config import EngineConfig
from gleanrl.server.engine import Engine
from sd_util import random_drafter, trained_drafter

NEW = 40


@pytest.fixture(scope="module")
def drafters(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    d = tmp_path_factory.mktemp("drafters")
    return {
        "random": random_drafter(tiny_qwen2, d / "random"),
        "trained": trained_drafter(tiny_qwen2, tiny_tokenizer, d / "trained"),
    }


def _engine(model, **kw) -> Engine:
    eng = Engine(EngineConfig(model_path=str(model), max_running_requests=32, **kw))
    eng.start()
    return eng


@pytest.fixture(scope="module")
def engines(tiny_qwen2, drafters):
    engs = {"plain": _engine(tiny_qwen2, sd="off")}
    for name, path in drafters.items():
        # a fixed plan
        engs[name] = _engine(tiny_qwen2, drafter=str(path), sd="on", num_draft_tokens=4)
    yield engs
    for e in engs.values():
        e.shutdown()


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok(PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)))["input_ids"] for i in range(n)]


@pytest.fixture(scope="module")
def reference(engines):
    prompts = _prompts(engines["plain"].tokenizer, 16)
    return prompts, run_all(engines["plain"], [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts])


@pytest.mark.parametrize("drafter", ["random", "trained"])
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_greedy_identical_to_plain(engines, reference, drafter, batch):
    prompts, plain = reference
    res = run_all(engines[drafter], [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts[:batch]])
    for r, ref in zip(res, plain):
        assert r["ids"] == ref["ids"]
        assert r["finish_reason"] == ref["finish_reason"] == {"type": "length", "length": NEW}
        assert r["logprobs"] == pytest.approx(ref["logprobs"], abs=1e-4)
        assert r["out"].spec_verify_ct > 0 and r["out"].draft_weight_version == "default"
    accept = sum(r["out"].spec_accept_length for r in res) / batch
    if drafter == "trained":  # drafts are really accepted, so the accept path is what was compared
        assert accept > 1.8, accept
    assert engines[drafter].stats()["avg_spec_accept_length"] >= 1.0


def test_adaptive_speculates_only_in_the_tail(tiny_qwen2, drafters, reference):
    prompts, plain = reference
    lengths = [8, 40, 12, 36, 10, 30, 6, 40]
    eng = _engine(tiny_qwen2, drafter=str(drafters["trained"]), sd="adaptive", sd_max_batch=3)
    try:
        res = run_all(eng, [req(p, max_new_tokens=n, ignore_eos=True) for p, n in zip(prompts, lengths)])
    finally:
        eng.shutdown()
    for r, ref, n in zip(res, plain, lengths):
        assert r["ids"] == ref["ids"][:n]
    # done before SD
    assert all(r["out"].spec_verify_ct == 0 for r, n in zip(res, lengths) if n <= 8)


def _stops_inside(engines, prompt: list[int], **params) -> tuple[dict, dict]:
    plain = run_all(engines["plain"], [req(prompt, **params)])[0]
    sd = run_all(engines["trained"], [req(prompt, **params)])[0]
    return plain, sd


def test_stops_are_exact_inside_accepted_drafts(engines, reference):
    """EOS-like stop ids, stop strings and max_new_tokens cut an accepted draft exactly where plain
    decoding stops; the final delta carries several tokens, so the stop did fall inside a draft."""
    prompts, plain = reference
    tok = engines["plain"].tokenizer
    inside = 0
    for p, ref in zip(prompts[:8], plain[:8]):
        out = ref["ids"]
        for params in (dict(stop_token_ids=[out[17]]), dict(stop=[tok.decode(out[21:23])]), dict(max_new_tokens=19)):
            params.setdefault("max_new_tokens", NEW)
            want, got = _stops_inside(engines, p, ignore_eos=True, **params)
            assert got["ids"] == want["ids"] and got["finish_reason"] == want["finish_reason"]
            assert len(want["ids"]) < NEW
            inside += len(got["out"].new_ids) > 1
    assert inside >= 6, "too few stops fell inside an accepted draft to test it"


def test_seeded_sampling_is_reproducible_with_a_fixed_draft_length(tiny_qwen2, drafters, reference):
    """SD draws from the request's generator in an order that depends on the draft lengths, so a
    seed reproduces a sample only when the draft length is fixed (the bandit's choice is not)."""
    prompts, _ = reference
    params = dict(temperature=0.9, top_p=0.9, top_k=50, min_p=0.02, max_new_tokens=NEW, ignore_eos=True, seed=7)
    eng = _engine(tiny_qwen2, drafter=str(drafters["trained"]), sd="on", num_draft_tokens=3)
    try:
        a = run_all(eng, [req(p, **params) for p in prompts[:4]])
        b = run_all(eng, [req(p, **params) for p in prompts[:4]])
    finally:
        eng.shutdown()
    for x, y in zip(a, b):
        assert x["ids"] == y["ids"] and len(x["ids"]) == NEW
        assert all(lp <= 1e-6 for lp in x["logprobs"]) and x["out"].spec_verify_ct > 0


def test_stream_deltas_add_up(engines, reference):
    import asyncio

    prompts, plain = reference
    deltas: list[int] = []

    async def main():
        eng = engines["trained"]
        async for out in eng.generate(req(prompts[0], max_new_tokens=NEW, ignore_eos=True)):
            deltas.append(len(out.new_ids))
        return out

    last = asyncio.run(main())
    assert sum(deltas) == NEW and max(deltas) > 1 and last.completion_tokens == NEW


def test_two_layer_target_takes_a_drafter(tiny_tokenizer, tmp_path):
    """A 2-layer target's drafter captures ids [-1, 0] (the embedding output and layer
    0's output)."""
    from gleanrl.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "m2", num_layers=2, tokenizer=tiny_tokenizer)
    drafter = random_drafter(model, tmp_path / "d2")
    plain, sd = _engine(model, sd="off"), _engine(model, drafter=str(drafter), sd="on")
    try:
        prompts = _prompts(plain.tokenizer, 4)
        want = run_all(plain, [req(p, max_new_tokens=24, ignore_eos=True) for p in prompts])
        got = run_all(sd, [req(p, max_new_tokens=24, ignore_eos=True) for p in prompts])
        assert [g["ids"] for g in got] == [w["ids"] for w in want]
        assert all(g["out"].spec_verify_ct > 0 for g in got)
    finally:
        plain.shutdown()
        sd.shutdown()


def test_sd_stats_follow_sglang_definitions(engines, reference):
    """meta_info: spec_accept_length = completion tokens / verify passes (SGLang 0.5.23, the
    prefill's token included), spec_accept_token_num = accepted drafts (no bonus),
    spec_draft_token_num = verified drafts, spec_accept_rate = their ratio. With sd "on" only the
    prefill's token and a last token that leaves no room to draft come from plain steps."""
    prompts, _ = reference
    for r in run_all(engines["trained"], [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts[:4]]):
        out = r["out"]
        meta = out.meta_info()
        ct, acc, drafted = meta["spec_verify_ct"], meta["spec_accept_token_num"], meta["spec_draft_token_num"]
        assert ct > 0 and 0 < acc <= drafted
        # each verify pass: accepted + 1
        assert out.completion_tokens - (acc + ct) in (1, 2)
        assert meta["spec_accept_length"] == pytest.approx(NEW / ct)
        assert meta["spec_accept_rate"] == pytest.approx(acc / drafted)
        assert (meta["spec_num_correct_drafts"], meta["spec_num_proposed_drafts"]) == (acc, drafted)
        assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": NEW}]
    plain = run_all(engines["plain"], [req(prompts[0], max_new_tokens=8, ignore_eos=True)])[0]["out"].meta_info()
    assert plain["spec_verify_ct"] == 0 and plain["spec_accept_length"] == 0.0 and plain["spec_accept_rate"] == 0.0


def test_greedy_rows_stay_exact_beside_sampled_rows_in_one_verify(engines, reference):
    """One batched verify serves greedy and sampled sequences together: the greedy ones still equal
    plain decoding token for token."""
    prompts, plain = reference
    sampled = [
        req(p, max_new_tokens=NEW, ignore_eos=True, temperature=0.8, top_k=20, seed=i)
        for i, p in enumerate(prompts[4:8])
    ]
    greedy = [req(p, max_new_tokens=NEW, ignore_eos=True) for p in prompts[:4]]
    res = run_all(engines["trained"], [r for pair in zip(greedy, sampled) for r in pair])
    for r, ref in zip(res[0::2], plain[:4]):
        assert r["ids"] == ref["ids"] and r["out"].spec_verify_ct > 0
    assert all(len(r["ids"]) == NEW and r["out"].spec_verify_ct > 0 for r in res[1::2])
