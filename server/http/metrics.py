"""Prometheus metrics named after SGLang's (`sglang:` -> `gleanrl:`). Gauges are read from the
engine at scrape time; token counters and latency histograms are measured at the HTTP edge. One
registry per app, so several servers can live in one process (tests)."""

from __future__ import annotations

import functools

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        gauge, counter = functools.partial(Gauge, registry=r), functools.partial(Counter, registry=r)
        latency = functools.partial(Histogram, buckets=_LATENCY_BUCKETS, registry=r)
        self.num_running_reqs = gauge("gleanrl:num_running_reqs", "Requests decoding now")
        self.num_queue_reqs = gauge("gleanrl:num_queue_reqs", "Requests waiting for a slot")
        self.spec_accept_length = gauge(
            "gleanrl:spec_accept_length", "Tokens per SD verify pass, over verify passes only (<= k + 1)"
        )
        self.tokens_per_target_pass = gauge(
            "gleanrl:tokens_per_target_pass",
            "Output tokens per target pass, plain decode passes included (1 without SD)",
        )
        self.spec_verify_passes = gauge(
            "gleanrl:spec_verify_passes", "SD verify passes by tokens emitted (the acceptance histogram)", ["tokens"]
        )
        self.spec_accept_token_num = gauge(
            "gleanrl:spec_accept_token_num",
            "Draft tokens accepted, by draft source (group: the prompt's other samples; eagle: the EAGLE-3 drafter)",
            ["source"],
        )
        self.spec_accept_length_by_source = gauge(
            "gleanrl:spec_accept_length_by_source",
            "Accepted draft tokens per verify pass that offered the source",
            ["source"],
        )
        self.prompt_tokens = counter("gleanrl:prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("gleanrl:generation_tokens", "Generated tokens")
        self.num_requests = counter("gleanrl:num_requests", "Finished requests", ["finish_reason"])
        self.ttft = latency("gleanrl:time_to_first_token_seconds", "Time to first token")
        self.e2e = latency("gleanrl:e2e_request_latency_seconds", "End-to-end request latency")

    def finished(self, prompt_tokens: int, finish_type: str, seconds: float) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.num_requests.labels(finish_reason=finish_type).inc()
        self.e2e.observe(seconds)

    def render(self, stats: dict) -> bytes:
        self.num_running_reqs.set(stats.get("num_running_reqs", 0))
        self.num_queue_reqs.set(stats.get("num_queue_reqs", 0))
        self.spec_accept_length.set(stats.get("avg_spec_accept_length") or 0.0)
        self.tokens_per_target_pass.set(stats.get("avg_tokens_per_target_pass") or 0.0)
        for source, n in (stats.get("spec_accept_token_num_by_source") or {}).items():
            self.spec_accept_token_num.labels(source=source).set(n)
        for source, x in (stats.get("avg_spec_accept_length_by_source") or {}).items():
            self.spec_accept_length_by_source.labels(source=source).set(x)
        for tokens, passes in enumerate(stats.get("spec_accept_histogram") or []):
            if passes:
                self.spec_verify_passes.labels(tokens=str(tokens)).set(passes)
        return generate_latest(self.registry)
