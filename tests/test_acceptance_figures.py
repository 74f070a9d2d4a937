"""Every acceptance-per-pass figure gleanrl reports stays within k + 1 on a run with adaptive SD,
where most tokens are decoded plainly: meta_info's SGLang counts, the trainer's step metrics, the
demo report, bench e2e's summary, `/server_info` and `/metrics`. SGLang's own per-request
`spec_accept_length` (completion tokens / verify passes) keeps its definition, though it is no
per-pass figure here."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from engine_util import PROMPTS
from gleanrl.bench.e2e_summary import summarize
from gleanrl.clients.rollout import Rollout
from gleanrl.demo_report import totals
from gleanrl.server.sd.plan import K_GRID
from gleanrl.trainer.metrics import rollout_metrics
from sd_util import trained_drafter
from serving import running_app

# the longest EAGLE-3 chain adaptive SD may verify (the default sources: EAGLE-3 only)
K = max(K_GRID)
SHORT, LONG = 40, 88  # the long requests run SD only once the short ones have finished


async def _generate(url: str, prompts: list[list[int]]) -> list[dict]:
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(i: int, ids: list[int]):
            n = LONG if i < 2 else SHORT
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
            return (await client.post(f"{url}/generate", json=body)).raise_for_status().json()

        return await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)])


@pytest.fixture(scope="module")
def served(tiny_qwen2, tiny_tokenizer, tmp_path_factory):
    drafter = trained_drafter(
        tiny_qwen2, tiny_tokenizer, tmp_path_factory.mktemp("accept") / "drafter", new_tokens=LONG + 8
    )  # covers the positions SD runs at
    prompts = [tiny_tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"] for i in range(10)]
    with running_app(tiny_qwen2, drafter=str(drafter), sd="adaptive", sd_max_batch=2, max_running_requests=16) as (
        url,
        _,
    ):
        bodies = asyncio.run(_generate(url, prompts))
        info = httpx.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    return prompts, bodies, info, metrics


def test_meta_info_keeps_sglang_fields_and_per_pass_stays_within_k_plus_1(served):
    _, bodies, _, _ = served
    mixed = 0
    for body in bodies:
        meta = body["meta_info"]
        ct, acc, drafted = meta["spec_verify_ct"], meta["spec_accept_token_num"], meta["spec_draft_token_num"]
        if not ct:
            continue
        # SGLang 0.5.23
        assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / ct)
        assert acc <= drafted <= K * ct and 1 <= (acc + ct) / ct <= K + 1
        mixed += acc + ct < meta["completion_tokens"] - 1  # plain tokens beside verified ones
    assert mixed, "no request mixed plain and SD decoding: the run does not test adaptive SD"


def test_reported_figures_stay_within_k_plus_1(served):
    prompts, bodies, info, metrics = served
    rollouts = []
    for i, (ids, body) in enumerate(zip(prompts, bodies)):
        rollouts.append(r := Rollout(ids, group_id=i, index=0, sample={}))
        r.apply(body)
    row = rollout_metrics(rollouts, 0.0, 1.0, lambda r: 0.0)
    assert row["spec_verify_ct"] > 0 and row["spec_tokens"] < row["output_tokens"]
    assert 1 < row["spec_accept_length"] <= K + 1 and 1 < row["tokens_per_pass"] < row["spec_accept_length"]
    row |= {"step": 1, "rollout_s": 1.0, "tail_s": 0.5, "train_s": 1.0, "push_s": 0.0}
    assert totals([row])["spec_accept_served"] == pytest.approx(row["spec_accept_length"])
    assert summarize({"b_adaptive": [row]})["accept_len_adaptive"] == pytest.approx(row["spec_accept_length"])
    assert 1 < info["avg_spec_accept_length"] <= K + 1 and 1 <= info["avg_tokens_per_target_pass"] <= K + 1
    gauge = float(re.search(r"^gleanrl:spec_accept_length (\S+)$", metrics, re.M).group(1))
    assert gauge == pytest.approx(info["avg_spec_accept_length"])
    assert float(re.search(r"^gleanrl:tokens_per_target_pass (\S+)$", metrics, re.M).group(1)) >= 1.0
