"""The hostile kinds of `gleanrl bench load --hostile` (`hostile.py` measures them): name -> one
request, sent back to back. Refused: oversize bodies to the server and to `gleanrl proxy`, declared
and chunked; refused tensor and disk updates; absurd `n` and batches through the proxy. Served
(`SERVED`): the most a request may make the engine do (a catastrophic stop_regex over a long output,
top_logprobs_num at its limit over the prompt and the output, a prompt near the context length)."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import httpx

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


def _body(total: int):
    sent = 0
    while sent < total:
        sent += len(CHUNK)
        yield CHUNK


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
        return lambda http: http.post(url, content=_body(OVERSIZE), headers=headers).status_code

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
