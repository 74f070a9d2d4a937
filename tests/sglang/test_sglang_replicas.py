"""Scale-out with mixed replicas: the trainer's client over a real SGLang server and an embedded
server spreads generation over both and pushes a weight update to both before the next step."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.sglang


def test_client_spreads_requests_and_updates_every_replica(restore_weights, sglang_model_b, sglang_tokenizer):
    from gleanrl.clients.rollout_client import RolloutClient
    from serving import running_server

    sglang, ids = restore_weights, sglang_tokenizer.encode("12+30=")
    params = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    with running_server(sglang.model) as embedded:

        async def go():
            async with RolloutClient([sglang.url, embedded]) as client:
                outs = await asyncio.gather(*(client.generate(ids, params) for _ in range(8)))
                await client.update_weights_from_disk(str(sglang_model_b), weight_version="replica-1")
                infos = [await client.model_info(u) for u in client.urls]
                after = [await client.generate(ids, params, url=u) for u in client.urls]
                return outs, infos, after

        outs, infos, after = asyncio.run(go())
    # a key only gleanrl adds
    by_sglang = sum("draft_weight_version" not in o["meta_info"] for o in outs)
    # both replicas served requests
    assert 0 < by_sglang < len(outs)
    assert len({tuple(o["output_ids"]) for o in outs}) == 1  # and agree (greedy)
    assert [i["weight_version"] for i in infos] == ["replica-1", "replica-1"]
    assert after[0]["output_ids"] == after[1]["output_ids"] != outs[0]["output_ids"]
