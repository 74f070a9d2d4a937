"""The hostile requests of tests/test_hostile.py, one per class of issue 22: each is (name, send,
check), where `send(http, url)` makes the request with an httpx.Client and `check(response)` returns
None when the server answered as it must (a clear 4xx/503 naming the field, or a 200 within bounds),
else what was wrong."""

from __future__ import annotations

import base64
import io
import pickle
import zipfile

import torch

JSON = {"content-type": "application/json"}
LIMITS = dict(
    max_batch=64, max_queued_requests=48, max_logprob_pairs=20_000, context_length=256, max_running_requests=8, max_n=8
)


def refused(status: int, *words: str):
    def check(r):
        text = r.text
        if r.status_code != status or not all(w in text for w in words):
            return f"expected {status} naming {words}, got {r.status_code}: {text[:300]}"
        return None

    return check


def served(r):
    if r.status_code != 200:
        return f"expected 200, got {r.status_code}: {r.text[:300]}"
    return None


def gen(sp: dict | None = None, **body):
    payload = {"text": "hostile", "sampling_params": {"max_new_tokens": 16, **(sp or {})}, **body}
    return lambda http, url: http.post(f"{url}/generate", json=payload)


def raw_gen(text: str):
    """A body sent as typed (JSON numbers like 1e400 parse as inf)."""
    return lambda http, url: http.post(f"{url}/generate", content=text.encode(), headers=JSON)


def tensor_update(obj=None, raw: bytes | None = None, **body):
    data = raw if raw is not None else pickle.dumps(obj)
    payload = {"serialized_named_tensors": [base64.b64encode(data).decode()], **body}
    return lambda http, url: http.post(f"{url}/update_weights_from_tensor", json=payload)


class Call:
    """Pickles as a call of `fn(*args)`: what a hostile payload asks the unpickler to run."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _compressed_storage() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data/0", b"\0" * (4 << 20))  # 4 MiB from a few KB
    return buf.getvalue()


def _inflating_storage() -> bytes:
    """A legacy torch.save record of a 28-byte storage whose header declares 1 GB."""
    import struct

    buf = io.BytesIO()
    torch.save(torch.zeros(7).untyped_storage(), buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    assert data.count(b"cpuq\x03K\x1c") == 1  # location "cpu", then numel 28 as a one-byte int
    return data.replace(b"cpuq\x03K\x1c", b"cpuq\x03J" + struct.pack("<i", 10**9))


def _fd_handle() -> bytes:
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's same-host reductions)

    return bytes(ForkingPickler.dumps([("model.embed_tokens.weight", torch.zeros(4))]))


def cases(vocab: int) -> list:
    import os

    from torch.storage import _load_from_bytes

    long_prompt = "word " * 30
    return [
        ("catastrophic stop_regex", gen({"stop_regex": ["(.+)+X", "(a|aa)+$", "(x+x+)+y"], "temperature": 0}), served),
        ("lookaround stop_regex", gen({"stop_regex": "(?=a)b"}), refused(400, "stop_regex", "RE2")),
        ("too many stop_regex", gen({"stop_regex": [f"a{i}" for i in range(9)]}), refused(400, "stop_regex")),
        ("too many stops", gen({"stop": [f"s{i}" for i in range(33)]}), refused(400, "stop")),
        ("a huge stop", gen({"stop": "x" * 300}), refused(400, "stop")),
        (
            "logit_bias 1e400",
            raw_gen('{"text": "a", "sampling_params": {"logit_bias": {"5": 1e400}}}'),
            refused(400, "logit_bias"),
        ),
        (
            "temperature 1e400",
            raw_gen('{"text": "a", "sampling_params": {"temperature": 1e400}}'),
            refused(400, "temperature"),
        ),
        ("temperature 1e-40 (greedy)", gen({"temperature": 1e-40}), served),
        ("NaN top_p", raw_gen('{"text": "a", "sampling_params": {"top_p": NaN}}'), refused(400, "not a JSON number")),
        ("repetition_penalty 1e-300", gen({"repetition_penalty": 1e-300}), refused(400, "repetition_penalty")),
        (
            "negative token_ids_logprob",
            gen(return_logprob=True, token_ids_logprob=[-1]),
            refused(400, "token_ids_logprob"),
        ),
        (
            "token_ids_logprob past the vocabulary",
            gen(return_logprob=True, token_ids_logprob=[vocab + 5]),
            refused(400, "token_ids_logprob"),
        ),
        (
            "token_ids_logprob of 5000 ids",
            gen(return_logprob=True, token_ids_logprob=list(range(5000))),
            refused(400, "token_ids_logprob"),
        ),
        ("top_logprobs_num 10^6", gen(return_logprob=True, top_logprobs_num=10**6), refused(400, "top_logprobs_num")),
        (
            "prompt logprobs within bounds",
            gen({"max_new_tokens": 1}, text=long_prompt, return_logprob=True, logprob_start_len=0, top_logprobs_num=32),
            served,
        ),
        (
            "prompt logprobs over the pair limit",
            gen(
                {"max_new_tokens": 100},
                text=long_prompt,
                return_logprob=True,
                logprob_start_len=0,
                top_logprobs_num=64,
                token_ids_logprob=list(range(200)),
            ),
            refused(400, "pairs"),
        ),
        ("a batch of 5000 prompts", gen(text=["x" * 100] * 5000), refused(400, "sequences")),
        ("n 10^9", gen({"n": 10**9}), refused(400, "n")),
        ("one request over the queue", gen(text=["q"] * 50), refused(503, "queue")),
        (
            "huge token id",
            lambda http, url: http.post(f"{url}/generate", json={"input_ids": [10**30]}),
            refused(400, "input_ids"),
        ),
        (
            "plain-text body",
            lambda http, url: http.post(
                f"{url}/generate", content=b'{"text": "a"}', headers={"content-type": "text/plain"}
            ),
            refused(415, "Content-Type"),
        ),
        (
            "form body to an admin route",
            lambda http, url: http.post(
                f"{url}/pause_generation",
                content=b"mode=abort",
                headers={"content-type": "application/x-www-form-urlencoded"},
            ),
            refused(415, "Content-Type"),
        ),
        (
            "DNS-rebinding Host",
            lambda http, url: http.post(f"{url}/flush_cache", headers={"host": "evil.example"}),
            refused(403, "Host"),
        ),
        (
            "cross-site Origin",
            lambda http, url: http.post(f"{url}/pause_generation", json={}, headers={"origin": "http://evil.example"}),
            refused(403, "cross-origin"),
        ),
        ("fd handle in a tensor update", tensor_update(raw=_fd_handle()), refused(400, "by value")),
        ("code in a tensor update", tensor_update(Call(os.system, "true")), refused(400, "not allowed")),
        ("bytes bomb in a tensor update", tensor_update(Call(bytes, 10**11)), refused(400, "count")),
        (
            "compressed storage",
            tensor_update(Call(_load_from_bytes, _compressed_storage())),
            refused(400, "compressed"),
        ),
        (
            "storage declaring 1 GB",
            tensor_update(Call(_load_from_bytes, _inflating_storage())),
            refused(400, "declares"),
        ),
        (
            "garbage tensor payload",
            lambda http, url: http.post(
                f"{url}/update_weights_from_tensor", json={"serialized_named_tensors": ["!!!"]}
            ),
            refused(400, "decoded"),
        ),
        (
            "bad flattened bucket",
            tensor_update({"flattened_tensor": torch.zeros(4), "metadata": [1, 2]}, load_format="flattened_bucket"),
            refused(400, "flattened_bucket"),
        ),
        (
            "process group to a foreign address",
            lambda http, url: http.post(
                f"{url}/init_weights_update_group",
                json={
                    "master_address": "10.9.8.7",
                    "master_port": 29500,
                    "rank_offset": 1,
                    "world_size": 2,
                    "backend": "gloo",
                },
            ),
            refused(400, "dist-allow"),
        ),
    ]
