"""Discovery routes as SGLang 0.5.23 shapes them (issue 13, item 6): /server_info and
/get_server_info with the parallel sizes, memory saver and capacity fields slime and sglang-router
read; /get_model_info; /get_load and /v1/loads (include sections, dp_rank filter, Prometheus format,
bad section 400)."""

from __future__ import annotations

import httpx
import pytest

from serving import running_server


@pytest.fixture(scope="module")
def url(tiny_qwen2):
    with running_server(tiny_qwen2, max_running_requests=3, context_length=128) as u:
        yield u


def get(url, path):
    r = httpx.get(f"{url}{path}", timeout=30)
    assert r.status_code == 200, (path, r.text)
    return r


def test_server_info_fields(url):
    for path in ("/server_info", "/get_server_info"):
        info = get(url, path).json()
        assert {k: info[k] for k in ("tp_size", "pp_size", "dp_size", "ep_size")} == dict.fromkeys(
            ("tp_size", "pp_size", "dp_size", "ep_size"), 1
        )
        assert info["enable_memory_saver"] is False and info["max_running_requests"] == 3
        assert info["max_total_tokens"] == info["max_total_num_tokens"] == 3 * 128
        assert info["max_req_input_len"] == 127 and info["internal_states"][0]["num_running_reqs"] == 0


def test_model_info_both_paths(url):
    a, b = get(url, "/model_info").json(), get(url, "/get_model_info").json()
    assert a == b and a["model_type"] == "qwen2" and a["is_generation"] is True and a["served_model_name"]


def test_loads(url):
    (row,) = get(url, "/get_load").json()
    assert row == {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    body = get(url, "/v1/loads").json()
    assert body["num_accelerators"] == 1 and len(body["loads"]) == 1
    load = body["loads"][0]
    assert load["dp_rank"] == 0 and load["max_running_requests"] == 3 and "queues" in load and "memory" in load
    assert "speculative" not in load  # SGLang: only when serving a drafter
    core = get(url, "/v1/loads?include=core").json()["loads"][0]
    assert "memory" not in core and "queues" not in core
    assert get(url, "/v1/loads?dp_rank=1").json()["loads"] == []
    assert 'sglang_num_running_reqs{dp_rank="0"} 0' in get(url, "/v1/loads?format=prometheus").text
    bad = httpx.get(f"{url}/v1/loads?include=bogus", timeout=30)
    assert bad.status_code == 400 and "bogus" in bad.json()["error"]["message"]
