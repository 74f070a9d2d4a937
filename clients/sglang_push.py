"""Weight pushes to a stock SGLang (0.5.23) rollout server, in the request shapes of SGLang's own
`io_struct` types (`UpdateWeightFromDiskReqInput`, `BeginWeightUpdateReqInput`,
`UpdateWeightsFromTensorReqInput`, `UpdateWeightsFromDistributedReqInput`, `InitWeightsUpdateGroupReqInput`);
`tests/sglang/test_push_requests.py` validates every payload against those types in SGLang's venv.

Hazards of stock SGLang that shape this module:
- `/update_weights_from_disk` has no `selector`: an unknown field is ignored and the load goes to every
  runner (target and, with SD, the drafter). A drafter is therefore never pushed through it.
- A drafter goes through a weight-update session: `/begin_weight_update {selector: "draft"}`, then
  `/update_weights_from_tensor` or `/update_weights_from_distributed` with `selector: "draft"`, then
  `/end_weight_update` (SGLang refuses tensor/distributed updates outside a session).
- On a server without a drafter, `selector: "draft"` loads nothing and still answers success, so
  `push_drafter_tensors` first checks `/server_info` for an EAGLE drafter.
- SGLang keeps one `weight_version` for all runners: a draft push never sends one (the policy's
  version would be overwritten); gleanrl tracks the drafter's version on its side.
- With SD on, `/update_weights_from_disk` of a new policy also reaches the draft runner, whose
  `LlamaForCausalLMEagle3.load_weights` overwrites part of the drafter with policy tensors and then fails
  on a shape (reproduced on CPU in tests/sglang/test_eagle3_load.py). Policy pushes to an SD server go
  through a session with `selector: "target"` instead (`tensor_requests` / `distributed_requests`).
- `flush_cache` is off for draft pushes: a flush fails while requests run, and a mid-rollout swap
  must not wait for them (SD stays lossless with a stale draft KV; only acceptance changes).
Callers validate checkpoints with `harvest.checkpoint_check` first: SGLang applies what it is given.
"""
from __future__ import annotations

import base64
import pickle
from typing import TYPE_CHECKING, Iterable

import httpx

if TYPE_CHECKING:
    import torch

DRAFT_ALGORITHMS = ("EAGLE", "EAGLE3")


class SGLangPushError(RuntimeError):
    """SGLang refused a push, or the push must not be sent; the message says why."""


def encode_named_tensors(named: Iterable[tuple[str, "torch.Tensor"]]) -> str:
    """Base64 of a plain pickle of [(name, cpu tensor)]: tensors travel by value (SGLang's SafeUnpickler
    rebuilds them with `torch.load(weights_only=True)`), so the trainer may be another process or host.
    (SGLang's in-process Engine uses ForkingPickler handles instead; those only work on the same host.)"""
    payload = [(name, t.detach().to("cpu").contiguous().clone()) for name, t in named]
    return base64.b64encode(pickle.dumps(payload, protocol=4)).decode("ascii")


def policy_disk_request(model_path: str, weight_version: str | None, flush_cache: bool = True,
                        abort_all_requests: bool = False) -> dict:
    body = {"model_path": model_path, "flush_cache": flush_cache, "abort_all_requests": abort_all_requests}
    if weight_version is not None:
        body["weight_version"] = weight_version
    return body


def tensor_requests(named: Iterable[tuple[str, "torch.Tensor"]], selector: str, weight_version: str | None = None,
                    flush_cache: bool = False, tp_size: int = 1) -> list[tuple[str, dict]]:
    """A weight-update session that sends tensors by value; one (identical) payload per TP rank."""
    update = {"serialized_named_tensors": [encode_named_tensors(named)] * tp_size, "selector": selector,
              "flush_cache": flush_cache, "abort_all_requests": False}
    if weight_version is not None:
        update["weight_version"] = weight_version
    return [("/begin_weight_update", {"selector": selector}), ("/update_weights_from_tensor", update),
            ("/end_weight_update", {})]


def distributed_requests(specs: Iterable[tuple[str, str, list[int]]], selector: str, weight_version: str | None = None,
                         flush_cache: bool = False, group_name: str = "weight_update_group") -> list[tuple[str, dict]]:
    """A session receiving tensors by broadcast from rank 0 (the trainer) over a group set up with
    `init_group_request` (NCCL on GPUs), in the order of `specs` = [(name, dtype, shape)]."""
    specs = list(specs)
    update = {"names": [s[0] for s in specs], "dtypes": [s[1] for s in specs], "shapes": [list(s[2]) for s in specs],
              "group_name": group_name, "selector": selector, "flush_cache": flush_cache, "abort_all_requests": False}
    if weight_version is not None:
        update["weight_version"] = weight_version
    return [("/begin_weight_update", {"selector": selector}), ("/update_weights_from_distributed", update),
            ("/end_weight_update", {})]


def draft_tensor_requests(named: Iterable[tuple[str, "torch.Tensor"]], tp_size: int = 1) -> list[tuple[str, dict]]:
    return tensor_requests(named, "draft", None, False, tp_size)


def draft_distributed_requests(specs: Iterable[tuple[str, str, list[int]]],
                               group_name: str = "weight_update_group") -> list[tuple[str, dict]]:
    return distributed_requests(specs, "draft", None, False, group_name)


def init_group_request(master_address: str, master_port: int, world_size: int, rank_offset: int = 1,
                       group_name: str = "weight_update_group", backend: str = "nccl") -> dict:
    return {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}


def _headers(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


def post(http: httpx.Client, url: str, path: str, body: dict, admin_api_key: str | None = None) -> dict:
    resp = http.post(url.rstrip("/") + path, json=body, headers=_headers(admin_api_key))
    try:
        answer = resp.json()
    except ValueError:
        answer = {"success": False, "message": resp.text}
    if resp.status_code >= 400 or (isinstance(answer, dict) and answer.get("success") is False):
        message = (answer.get("message") or answer.get("detail")) if isinstance(answer, dict) else answer
        raise SGLangPushError(f"{url}{path}: HTTP {resp.status_code}: {message}")
    return answer


def run_session(http: httpx.Client, url: str, requests: list[tuple[str, dict]],
                admin_api_key: str | None = None) -> list[dict]:
    """Send begin, update(s), end in order; `end_weight_update` is sent even when an update fails."""
    (begin, begin_body), *updates, (end, end_body) = requests
    answers = [post(http, url, begin, begin_body, admin_api_key)]
    try:
        for path, body in updates:
            answers.append(post(http, url, path, body, admin_api_key))
    finally:
        answers.append(post(http, url, end, end_body, admin_api_key))
    return answers


def is_stock_sglang(http: httpx.Client, url: str, api_key: str | None = None) -> bool:
    """gleanrl's embedded server reports `draft_model_path` in /model_info; stock SGLang does not."""
    resp = http.get(url.rstrip("/") + "/model_info", headers=_headers(api_key))
    resp.raise_for_status()
    return "draft_model_path" not in resp.json()


def has_drafter(http: httpx.Client, url: str, api_key: str | None = None) -> bool:
    resp = http.get(url.rstrip("/") + "/server_info", headers=_headers(api_key))
    resp.raise_for_status()
    return resp.json().get("speculative_algorithm") in DRAFT_ALGORITHMS


def push_drafter_tensors(url: str, named: list[tuple[str, "torch.Tensor"]], admin_api_key: str | None = None,
                         api_key: str | None = None, tp_size: int = 1, timeout_s: float = 300.0) -> list[dict]:
    """Hot-swap the serving drafter's weights (names as in the drafter checkpoint: `midlayer.*`, `fc.weight`...).
    Blocking; from async code use `asyncio.to_thread`."""
    with httpx.Client(timeout=timeout_s) as http:
        if not has_drafter(http, url, api_key or admin_api_key):
            raise SGLangPushError(f"{url} serves no EAGLE drafter (started without --speculative-algorithm); "
                                  "SGLang would answer success and load nothing")
        return run_session(http, url, draft_tensor_requests(named, tp_size), admin_api_key)


def push_drafter_dir(url: str, drafter_dir: str, **kw) -> list[dict]:
    """`push_drafter_tensors` with the tensors of a drafter checkpoint directory (validate it first with
    `harvest.checkpoint_check.check_drafter_checkpoint`)."""
    from pathlib import Path

    from safetensors.torch import load_file
    named = [item for f in sorted(Path(drafter_dir).glob("*.safetensors")) for item in sorted(load_file(f).items())]
    return push_drafter_tensors(url, named, **kw)
