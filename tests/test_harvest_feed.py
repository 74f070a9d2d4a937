"""The harvest feed: bounded (overflow dropped and counted), cursor reads, admin-key guarded, off by
default, filled from /generate (plain and streaming) and the OpenAI routes with what the
trainer got."""

from __future__ import annotations

import httpx
import pytest

from gleanrl.server.http.native.harvest_feed import FeedConfig, FeedUpdatesMiddleware, HarvestFeed, group_key
from tests.serving import running_server


def _fill(feed: HarvestFeed, n: int, out_len: int = 3) -> None:
    for i in range(n):
        feed.record(f"r{i}", [1, 2, i], list(range(out_len)), "v1", {"type": "length", "length": out_len})


def test_cursor_reads_every_record_once_in_order():
    feed = HarvestFeed(FeedConfig(max_records=100, max_read=4))
    _fill(feed, 10)
    seen, cursor = [], 0
    while True:
        page = feed.read(cursor)
        if not page["records"]:
            break
        seen += [r["rid"] for r in page["records"]]
        cursor = page["next_cursor"]
    assert seen == [f"r{i}" for i in range(10)] and cursor == 10
    small = HarvestFeed(FeedConfig(max_read_tokens=13))  # 6 tokens a record: two per read
    _fill(small, 5)
    assert [r["seq"] for r in small.read(0)["records"]] == [0, 1] and small.read(4)["next_cursor"] == 5
    assert page["missed"] == 0 and page["dropped"] == 0 and page["head"] == 10


def test_overflow_drops_the_oldest_and_counts_them():
    feed = HarvestFeed(FeedConfig(max_records=4, max_tokens=10_000))
    _fill(feed, 10)
    page = feed.read(0)
    assert [r["seq"] for r in page["records"]] == [6, 7, 8, 9]
    assert page["dropped"] == 6 and page["missed"] == 6 and page["buffered"] == 4
    # each record: 3 prompt + 3 output tokens
    tokens = HarvestFeed(FeedConfig(max_records=100, max_tokens=20))
    _fill(tokens, 10)
    page = tokens.read(0)
    assert page["tokens"] <= 20 and page["buffered"] == 3 and page["dropped"] == 7


def test_record_fields_and_group_key():
    feed = HarvestFeed()
    feed.record("a", [5, 6, 7], [8, 9], 3, {"type": "stop", "matched": 2}, meta={"spec_verify_ct": 1})
    [rec] = feed.read(0)["records"]
    assert rec["prompt_ids"] == [5, 6, 7] and rec["output_ids"] == [8, 9] and rec["weight_version"] == "3"
    assert rec["finish_reason"] == {"type": "stop", "matched": 2} and rec["spec_verify_ct"] == 1
    assert rec["group_key"] == group_key([5, 6, 7]) != group_key([5, 6, 8])
    with pytest.raises(ValueError, match="max_records"):
        FeedConfig(max_records=0)
    with pytest.raises(ValueError, match="cursor"):
        feed.read(-1)


def _gen(url: str, ids: list[int], **kw) -> httpx.Response:
    body = {"input_ids": ids, "return_logprob": True, "sampling_params": {"max_new_tokens": 6, "temperature": 0.0}}
    return httpx.post(f"{url}/generate", json=body | kw, timeout=60)


def test_feed_over_http_records_what_the_client_got(tiny_qwen2):
    admin = {"Authorization": "Bearer adm"}
    with running_server(tiny_qwen2, harvest_feed=True, harvest_feed_records=3, admin_api_key="adm") as url:
        got = _gen(url, [3, 4, 5]).json()
        with httpx.stream(
            "POST",
            f"{url}/generate",
            json={"input_ids": [7, 8], "stream": True, "sampling_params": {"max_new_tokens": 4}},
            timeout=60,
        ) as r:
            assert r.status_code == 200 and [x for x in r.iter_lines() if x][-1] == "data: [DONE]"
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        done = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 3}, timeout=60)
        assert done.status_code == 200, done.text
        page = httpx.get(f"{url}/harvest_feed", params={"cursor": 0}, headers=admin, timeout=30).json()
        first, streamed, _ = page["records"]
        assert first["prompt_ids"] == [3, 4, 5] and first["output_ids"] == got["output_ids"]
        assert first["weight_version"] == got["meta_info"]["weight_version"]
        assert first["finish_reason"] == got["meta_info"]["finish_reason"]
        assert streamed["prompt_ids"] == [7, 8] and len(streamed["output_ids"]) == 4
        assert page["load"] == {"num_running_reqs": 0, "num_queue_reqs": 0, "paused": False}
        _gen(url, [9])  # a fourth: the oldest goes
        page = httpx.get(f"{url}/harvest_feed", params={"cursor": 0}, headers=admin, timeout=30).json()
        assert page["dropped"] == 1 and page["missed"] == 1 and page["records"][0]["prompt_ids"] == [7, 8]
        empty = httpx.get(f"{url}/harvest_feed", params={"cursor": 4, "wait_s": 0.2}, headers=admin, timeout=30)
        assert empty.json()["records"] == [] and empty.json()["next_cursor"] == 4
        bad = httpx.get(f"{url}/harvest_feed", params={"since": 1}, headers=admin, timeout=30)
        assert bad.status_code == 400 and "since" in bad.json()["error"]["message"]


def test_feed_needs_the_admin_key_and_is_off_by_default(tiny_qwen2):
    with running_server(tiny_qwen2, harvest_feed=True, api_key="user", admin_api_key="adm") as url:
        assert httpx.get(f"{url}/harvest_feed", timeout=30).status_code == 401
        user = httpx.get(f"{url}/harvest_feed", headers={"Authorization": "Bearer user"}, timeout=30)
        assert user.status_code == 401
        assert httpx.get(f"{url}/harvest_feed", headers={"Authorization": "Bearer adm"}, timeout=30).status_code == 200
    with running_server(tiny_qwen2) as url:
        _gen(url, [3, 4])
        off = httpx.get(f"{url}/harvest_feed", timeout=30)
        assert off.status_code == 404 and "--harvest-feed" in off.json()["error"]["message"]


def test_policy_weight_updates_are_listed(tiny_qwen2, tiny_qwen2_b, tmp_path):
    admin = {"Authorization": "Bearer adm"}
    with running_server(tiny_qwen2, harvest_feed=True, admin_api_key="adm") as url:

        def update(**body) -> int:
            return httpx.post(f"{url}/update_weights_from_disk", json=body, headers=admin, timeout=120).status_code

        assert update(model_path=str(tiny_qwen2_b), weight_version="5") == 200
        assert update(model_path=str(tmp_path / "missing"), weight_version="6") == 400
        updates = httpx.get(f"{url}/harvest_feed", headers=admin, timeout=30).json()["weight_updates"]
    assert updates == [{"kind": "disk", "weight_version": "5", "model_path": str(tiny_qwen2_b), "after_seq": 0}]


def test_update_middleware_lists_tensor_updates_not_draft_pushes():
    import asyncio

    async def app(scope, receive, send):  # any route module answering success
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"success": true}'})

    feed = HarvestFeed()

    async def go():
        transport = httpx.ASGITransport(app=FeedUpdatesMiddleware(app, feed))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            await http.post("/update_weights_from_tensor", json={"selector": "draft"})
            await http.post("/update_weights_from_tensor", json={"weight_version": "2"})
            await http.post("/update_weights_from_distributed", json={"selector": "target", "weight_version": "3"})
            await http.post("/generate", json={"weight_version": "9"})

    asyncio.run(go())
    assert [(u["kind"], u["weight_version"]) for u in feed.read(0)["weight_updates"]] == [
        ("tensor", "2"),
        ("distributed", "3"),
    ]
