"""Fuzzing the HTTP edge from the server's own OpenAPI document (`app.openapi()`, request bodies
included) with schemathesis: schema-conforming and schema-violating requests to every native and
OpenAI route of a real server on a loopback port. No response may be a 5xx (nor an SSE error of type
server_error), and afterwards the server is idle and answers exactly as before.

CI makes GLEANRL_FUZZ_EXAMPLES requests (default 300, ~40 s); the reliability figure is the same
test with GLEANRL_FUZZ_EXAMPLES=1000 (see /work/notes/readme_reliability.md)."""

from __future__ import annotations

import os

import httpx
import pytest
import requests

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

from serving import running_app, server_stats, wait_until  # noqa: E402

EXAMPLES = int(os.environ.get("GLEANRL_FUZZ_EXAMPLES", "300"))
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def _strategies(schema: dict):
    ops = [r.ok() for r in schemathesis.openapi.from_dict(schema).get_all_operations()]
    found = []
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                found.append(op.as_strategy(generation_mode=mode))
            except Exception:  # an operation with nothing to negate (no parameters, no body)
                continue
    return ops, st.one_of(found)


def test_fuzz_from_openapi_no_5xx_and_server_still_correct(tiny_qwen2):
    with running_app(
        tiny_qwen2, max_request_bytes=16384, max_n=2, max_new_tokens_cap=8, context_length=64, max_running_requests=4
    ) as (url, app):
        schema = app.openapi()
        # bodies are described, not only paths
        assert schema["paths"]["/generate"]["post"]["requestBody"]
        ops, cases = _strategies(schema)
        paths = {op.path for op in ops}
        assert {"/generate", "/v1/completions", "/v1/chat/completions", "/update_weights_from_disk"} <= paths
        before = httpx.post(f"{url}/generate", json={"text": "Hello", "sampling_params": GREEDY}, timeout=60).json()
        session, calls, bad = requests.Session(), {"n": 0, "by_status": {}}, []

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases)
        def one(case):
            r = case.call(base_url=url, session=session, timeout=60)
            calls["n"] += 1
            calls["by_status"][r.status_code] = calls["by_status"].get(r.status_code, 0) + 1
            if r.status_code >= 500 or '"server_error"' in r.text:
                bad.append((case.method, case.path, case.body, r.status_code, r.text[:300]))
            if case.path == "/pause_generation":
                session.post(f"{url}/continue_generation", timeout=30)
            if case.path == "/release_memory_occupation":
                # a later resume may be malformed (415, 400): undo it now
                session.post(f"{url}/resume_memory_occupation", json={}, timeout=30)

        one()
        print(f"fuzz: {calls['n']} requests over {len(paths)} paths, statuses {sorted(calls['by_status'].items())}")
        assert not bad, bad[:5]
        assert calls["n"] >= EXAMPLES
        assert len([s for s in calls["by_status"] if 200 <= s < 300]) and calls["by_status"].get(400)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 0 == server_stats(url)["num_queue_reqs"])
        after = httpx.post(f"{url}/generate", json={"text": "Hello", "sampling_params": GREEDY}, timeout=60).json()
        assert after.get("output_ids") == before["output_ids"], after
        assert after["meta_info"]["weight_version"] == before["meta_info"]["weight_version"]


# Numbers JSON can carry that break arithmetic downstream (1e400 parses as inf), huge ids and
# counts, and the non-JSON constants some encoders emit (NaN, Infinity): each lands in a number
# field of a body.
EXTREME = [
    "1e400",
    "-1e400",
    "1e308",
    "-1e308",
    "1e-320",
    "1e-40",
    "-0.0",
    "0",
    "-1",
    "255",
    "383",
    "384",
    str(2**31),
    str(2**63),
    str(10**30),
    str(-(10**30)),
    "NaN",
    "Infinity",
    "-Infinity",
    "0.5",
    "2.5",
]
SAMPLING = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "n",
    "max_new_tokens",
    "min_new_tokens",
    "sampling_seed",
    "stream_interval",
]
TOP = ["top_logprobs_num", "logprob_start_len"]
OPENAI = [
    "temperature",
    "top_p",
    "n",
    "max_tokens",
    "logprobs",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "top_k",
    "min_p",
]


def _body(route: str, fields: dict[str, str], ids: list[str], bias: str | None, stop_ids: list[str]) -> str:
    biased = [] if bias is None else [f'"logit_bias": {{"{bias}": {bias}}}']
    if route == "/v1/completions":
        items = [f'"prompt": [{", ".join(ids) or "5"}]', *biased] + [
            f'"{k}": {v}' for k, v in fields.items() if k in OPENAI
        ]
        return "{" + ", ".join(items) + "}"
    sp = [f'"{k}": {v}' for k, v in fields.items() if k in SAMPLING] + [
        *biased,
        f'"stop_token_ids": [{", ".join(stop_ids)}]',
    ]
    top = [f'"{k}": {v}' for k, v in fields.items() if k in TOP]
    return (
        "{" + f'"input_ids": [{", ".join(ids) or "5"}], "return_logprob": true, '
        f'"token_ids_logprob": [{", ".join(stop_ids)}], "sampling_params": {{{", ".join(sp)}}}'
        + "".join(f", {t}" for t in top)
        + "}"
    )


def test_fuzz_extreme_numbers_huge_ids_and_counts(tiny_qwen2):
    with running_app(tiny_qwen2, max_n=2, max_new_tokens_cap=8, context_length=64, max_running_requests=4) as (url, _):
        before = httpx.post(f"{url}/generate", json={"text": "Hello", "sampling_params": GREEDY}, timeout=60).json()
        bad, statuses = [], {}
        # some are served
        value = st.one_of(st.sampled_from(EXTREME), st.sampled_from(["0", "1", "0.9", "3"]))
        http = httpx.Client(timeout=120, headers={"content-type": "application/json"})

        @settings(
            max_examples=max(EXAMPLES // 2, 50),
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(
            route=st.sampled_from(["/generate", "/v1/completions"]),
            fields=st.dictionaries(st.sampled_from(SAMPLING + TOP + OPENAI), value, max_size=4),
            ids=st.lists(value, max_size=3),
            bias=st.one_of(st.none(), value),
            stop_ids=st.lists(value, max_size=2),
        )
        def one(route, fields, ids, bias, stop_ids):
            r = http.post(f"{url}{route}", content=_body(route, fields, ids, bias, stop_ids))
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500 or '"server_error"' in r.text:
                bad.append((route, fields, ids, bias, stop_ids, r.status_code, r.text[:300]))

        one()
        http.close()
        print(f"fuzz (extreme numbers): statuses {sorted(statuses.items())}")
        assert not bad, bad[:5]
        assert statuses.get(400) and statuses.get(200)
        assert wait_until(lambda: server_stats(url)["num_running_reqs"] == 0 == server_stats(url)["num_queue_reqs"])
        after = httpx.post(f"{url}/generate", json={"text": "Hello", "sampling_params": GREEDY}, timeout=60).json()
        assert after["output_ids"] == before["output_ids"]
