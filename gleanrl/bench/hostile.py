"""`gleanrl bench load --hostile`: what hostile and careless clients cost an honest one. A benign client (own process)
streams short greedy `/generate` requests (24 tokens) back to back and polls `/health`; meanwhile a hostile client here
sends one kind of request (`kinds`: refused ones, and served ones, `SERVED`, that must cost the benign one no more than
any other running request) back to back for `--phase-s` seconds, kind after kind, then all kinds in turn (the mix).
Before the first kind and after the mix the benign client runs alone (the baseline: the better of the two).

Reported: benign p50/p99 per phase and its ratio to the baseline, the CPU seconds the server and the proxy spent in the
phase (what refusing cost them, apart from the clients' own CPU on a shared machine), the slowest kind and its cost, the
worst `/health`, benign errors, hostile requests answered otherwise than refused, whether the same weights serve
after, and the mix's three slowest benign requests with the hostile kinds in flight while each ran. Exit 1 on a benign
error, a hostile request not refused, changed weights, a `/health` over 1 s, or the mix's p99 over `--p99-bound` x the
baseline's."""

from __future__ import annotations

import base64
import itertools
import multiprocessing
import pickle
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from gleanrl.bench.serve_process import GleanrlProcess, ServeProcess, cpu_s, model_or_tiny, verdict

OVERSIZE = 300 << 20  # what the hostile client sent: 300 MB
# served, not refused: the most a request may make the engine do (the server's defaults)
SERVED = frozenset(
    {
        "catastrophic stop_regex, 256 tokens",
        "top_logprobs_num 64, prompt and output",
        "top_logprobs_num 64, prompt and output, streamed",
        "a prompt near the context",
    }
)
CHUNK = b" " * (1 << 20)


def _tensor_update(model_dir: str) -> dict:
    """The whole model's tensors, one of them NaN at the very end: decoded in full, then refused."""
    from safetensors.torch import load_file

    named = sorted((k, v) for f in sorted(Path(model_dir).glob("*.safetensors")) for k, v in load_file(f).items())
    name, t = named[-1]
    bad = t.clone().float()
    bad.view(-1)[-1] = float("nan")
    data = pickle.dumps(named[:-1] + [(name, bad)], protocol=4)
    return {"serialized_named_tensors": [base64.b64encode(data).decode()]}


def kinds(server: str, proxy: str, model_dir: str) -> dict:
    """name -> send(http) returning the status (0: the connection was closed on it)."""
    update = _tensor_update(model_dir)
    context = httpx.get(f"{server}/server_info", timeout=30).json()["context_length"]
    json_headers = {"content-type": "application/json"}
    logprobs = {"text": "word " * 200, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 64}
    logprobs |= {"sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
    regexes = ["(.+)+X", "(a|aa)+$", "(x+x+)+y", "(.*a){12}", "([a-z]+)*=", "(\\w+\\s?)*#", "(.|\n)*Z", "(ab|a)*c"]
    catastrophic = {"text": "x", "sampling_params": {"max_new_tokens": 256, "ignore_eos": True, "stop_regex": regexes}}
    near = {"input_ids": [5 + i % 300 for i in range(context - 40)], "sampling_params": {"max_new_tokens": 32}}

    def post(url, **kw):
        return lambda http: http.post(url, **kw).status_code

    def oversize(url, declared):
        headers = json_headers | ({"content-length": str(OVERSIZE)} if declared else {})
        return lambda http: (
            http.post(url, content=itertools.repeat(CHUNK, OVERSIZE // len(CHUNK)), headers=headers).status_code
        )

    return {
        "oversize body to the server": oversize(f"{server}/generate", True),
        "oversize chunked body to the server": oversize(f"{server}/generate", False),
        "oversize body to the proxy": oversize(f"{proxy}/generate", True),
        "oversize chunked body to the proxy": oversize(f"{proxy}/generate", False),
        "refused tensor update (NaN, whole model)": post(f"{server}/update_weights_from_tensor", json=update),
        "refused disk update": post(f"{server}/update_weights_from_disk", json={"model_path": "/nonexistent/model"}),
        "n 10^9 through the proxy": post(f"{proxy}/generate", json={"text": "x", "sampling_params": {"n": 10**9}}),
        "n 1000 through the proxy": post(
            f"{proxy}/generate", json={"text": "x", "sampling_params": {"n": 1000, "max_new_tokens": 24}}
        ),
        "5000 prompts through the proxy": post(f"{proxy}/generate", json={"text": ["x" * 100] * 5000}),
        "catastrophic stop_regex, 256 tokens": post(f"{server}/generate", json=catastrophic),
        "top_logprobs_num 64, prompt and output": post(f"{server}/generate", json=logprobs),
        "top_logprobs_num 64, prompt and output, streamed": post(
            f"{server}/generate", json=logprobs | {"stream": True}
        ),
        "a prompt near the context": post(f"{server}/generate", json=near),
    }


BENIGN = {
    "text": "The quick brown fox",
    "stream": True,
    "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
}


def _benign(url: str, stop, out) -> None:
    """The honest client (own process): (start, latency, error) per request, and (time, /health latency) every 50 ms."""
    requests, health, done = [], [], threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as http:
            while not done.is_set():
                t0 = time.monotonic()
                ok = http.get(f"{url}/health").status_code == 200
                health.append((t0, time.monotonic() - t0 if ok else float("inf")))
                time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            t0, error = time.monotonic(), None
            try:
                with http.stream("POST", f"{url}/generate", json=BENIGN) as r:
                    lines = [x for x in r.iter_lines() if x.startswith("data:")]
                if r.status_code != 200 or not lines or lines[-1] != "data: [DONE]":
                    error = f"status {r.status_code}, {len(lines)} chunks"
            except httpx.HTTPError as exc:
                error = repr(exc)
            requests.append((t0, time.monotonic() - t0, error))
    done.set()
    poller.join()
    out.put((requests, health))


def _hostile(sends: dict, until: float, tally: dict, spans: list) -> None:
    """One hostile client: its requests (kind -> send) back to back (the mix: each kind in turn); each one's
    (kind, start, end) into `spans`."""
    with httpx.Client(timeout=120) as http:
        while time.monotonic() < until:
            for kind, send in sends.items():
                t0 = time.monotonic()
                try:
                    status = send(http)
                except httpx.HTTPError:
                    status = 0  # closed on us: refused before the body was read
                spans.append((kind, t0, time.monotonic()))
                tally[status] = tally.get(status, 0) + 1


def _overlapping(requests: list, spans: list, t0: float, t1: float, top: int = 3) -> list[dict]:
    """The phase's `top` slowest benign requests, each with the hostile kinds in flight while it ran (longest
    overlap first): what the p99 is made of."""
    slow = sorted(((lat, s) for s, lat, err in requests if t0 <= s < t1 and err is None), reverse=True)[:top]
    rows = []
    for lat, start in slow:
        overlap: dict[str, float] = {}
        for kind, a, b in spans:
            if (shared := min(b, start + lat) - max(a, start)) > 0:
                overlap[kind] = overlap.get(kind, 0.0) + shared
        rows.append({"latency_s": lat, "overlap_s": dict(sorted(overlap.items(), key=lambda kv: -kv[1]))})
    return rows


def _pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def _greedy(url: str) -> tuple[list[int], str]:
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}
    r = httpx.post(f"{url}/generate", timeout=120, json=body).json()
    return r["output_ids"], r["meta_info"]["weight_version"]


def measure(server: str, proxy: str, model_dir: str, phase_s: float, pids: tuple[int, ...] = ()) -> dict:
    """The phases; `pids` (server, proxy): their CPU seconds per phase are reported too."""
    hostile = kinds(server, proxy, model_dir)
    before = _greedy(server)
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    benign = ctx.Process(target=_benign, args=(server, stop, out), daemon=True)
    benign.start()
    time.sleep(1.0)  # the benign process imports and warms up
    phases, tallies, spans = [], {}, []
    for name in ["baseline", *hostile, "mix", "baseline after"]:
        t0, cpu0 = time.monotonic(), sum(map(cpu_s, pids))
        sends = hostile if name == "mix" else {name: hostile[name]} if name in hostile else {}
        tally: dict = {}
        if sends:  # one hostile client, none in the baselines
            _hostile(sends, t0 + phase_s, tally, spans)
        time.sleep(max(0.0, t0 + phase_s - time.monotonic()))
        phases.append((name, t0, time.monotonic(), sum(map(cpu_s, pids)) - cpu0))
        tallies[name] = tally
    stop.set()
    requests, health = out.get(timeout=300)
    benign.join(timeout=60)
    after = _greedy(server)
    rows = {}
    for name, t0, t1, cpu in phases:
        lat = [lat for s, lat, err in requests if t0 <= s < t1 and err is None]
        rows[name] = {
            "requests": len(lat),
            "p50_s": _pct(lat, 0.5),
            "p99_s": _pct(lat, 0.99),
            "health_worst_s": max((h for s, h in health if t0 <= s < t1), default=None),
            "hostile_answers": {str(k): v for k, v in tallies[name].items()},
            "server_proxy_cpu_s": cpu,
        }
    base = min(rows["baseline"]["p99_s"] or float("inf"), rows["baseline after"]["p99_s"] or float("inf"))
    for row in rows.values():
        row["p99_ratio"] = row["p99_s"] / base if row["p99_s"] and base else None
    slowest = max(hostile, key=lambda k: rows[k]["p99_ratio"] or 0.0)
    not_refused = {
        f"{k}: {status}": count
        for k, row in rows.items()
        for status, count in row["hostile_answers"].items()
        if not (status == "0" or 400 <= int(status) < 500 or (status == "200" and k in SERVED | {"mix"}))
    }
    alone = min(("baseline", "baseline after"), key=lambda k: rows[k]["p99_s"] or float("inf"))
    mix_t0, mix_t1 = next((t0, t1) for name, t0, t1, _ in phases if name == "mix")
    return {
        "phase_s": phase_s,
        "baseline_p99_s": base,
        "alone": {"p50_s": rows[alone]["p50_s"], "p99_s": rows[alone]["p99_s"]},
        "under_mix": {"p50_s": rows["mix"]["p50_s"], "p99_s": rows["mix"]["p99_s"]},
        "mix_slowest": _overlapping(requests, spans, mix_t0, mix_t1),
        "phases": rows,
        "slowest_kind": slowest,
        "slowest_p99_ratio": rows[slowest]["p99_ratio"],
        "benign_errors": [e for _, _, e in requests if e][:5],
        "benign_error_count": sum(1 for _, _, e in requests if e),
        "health_worst_s": max((h for _, h in health), default=None),
        "hostile_not_refused": not_refused,
        "weights_unchanged": before == after,
        "error_samples": [],
    }


def run(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        model = model_or_tiny(args.model, tmp)
        with ServeProcess(model, Path(tmp) / "server.log", threads=args.threads, extra=args.serve_arg) as server:
            with GleanrlProcess(["proxy", "--upstream", server.url]) as proxy:
                summary = measure(server.url, proxy.url, model, args.phase_s, (server.pid, proxy.pid))
    _print(summary)
    ok = (
        not summary["benign_error_count"]
        and not summary["hostile_not_refused"]
        and summary["weights_unchanged"]
        and (summary["health_worst_s"] or 0) < 1.0
        and (summary["under_mix"]["p99_s"] or 0)
        <= max(args.p99_bound * summary["baseline_p99_s"], summary["baseline_p99_s"] + args.p99_slack_ms / 1000)
    )
    return verdict(summary, ok, args.json)


def _print(s: dict) -> None:
    print(
        f"{'phase':42} {'benign':>6} {'p50 ms':>8} {'p99 ms':>8} {'x base':>7} "
        f"{'/health ms':>10} {'cpu s':>6}  hostile answers"
    )
    for name, row in s["phases"].items():
        ms = lambda v: f"{v * 1000:8.0f}" if v is not None else "       -"  # noqa: E731
        ratio = f"{row['p99_ratio']:7.2f}" if row["p99_ratio"] else "      -"
        print(
            f"{name:42} {row['requests']:6d} {ms(row['p50_s'])} {ms(row['p99_s'])} {ratio} "
            f"{ms(row['health_worst_s'])}   {row['server_proxy_cpu_s']:6.2f}  {row['hostile_answers']}"
        )
    print(
        f"slowest hostile kind: {s['slowest_kind']} (benign p99 x{s['slowest_p99_ratio']:.2f} of the baseline's "
        f"{s['baseline_p99_s'] * 1000:.0f} ms); worst /health {(s['health_worst_s'] or 0) * 1000:.0f} ms; benign "
        f"errors {s['benign_error_count']}; hostile not refused {s['hostile_not_refused'] or 'none'}; weights "
        f"unchanged {s['weights_unchanged']}"
    )
    alone, mix = s["alone"], s["under_mix"]
    ms = lambda v: f"{v * 1000:.0f}" if v is not None else "-"  # noqa: E731
    print(
        f"benign alone: p50 {ms(alone['p50_s'])} ms, p99 {ms(alone['p99_s'])} ms; under the mix: "
        f"p50 {ms(mix['p50_s'])} ms, p99 {ms(mix['p99_s'])} ms"
    )
    for row in s["mix_slowest"]:
        during = ", ".join(f"{kind} {sec * 1000:.0f} ms" for kind, sec in row["overlap_s"].items()) or "nothing"
        print(f"  a slowest benign request under the mix, {row['latency_s'] * 1000:.0f} ms, overlapped: {during}")
    if s["benign_errors"]:
        print(f"benign errors: {s['benign_errors']}", file=sys.stderr)
