"""Weight pushes to stock SGLang over a process group (NCCL on GPUs; gloo works on CPU, which is how the
tests run this exact protocol against the real engine): the trainer is rank 0 and broadcasts each tensor;
SGLang's ranks start at `rank_offset` (1) and receive into buffers of the announced names/dtypes/shapes.

    group = open_weight_group(url, "10.0.0.5", 29600, world_size=1 + tp_size, backend="nccl")
    push_over_group(url, group, named_tensors, selector="draft")     # or "target" with a weight_version
    close_weight_group(url, group)

The group is made like SGLang's `init_custom_process_group` (a rendezvous store prefixed with the group
name, a new process group registered without a default group): both sides must agree on that layout.
"""
from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import httpx

if TYPE_CHECKING:
    import torch

from gleanrl.clients.sglang_push import SGLangPushError, distributed_requests, init_group_request, post


@dataclass
class WeightGroup:
    pg: Any                   # torch ProcessGroup
    group_name: str
    admin_api_key: str | None


def _in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run `fn` in a thread (an HTTP call that only returns once this side joins in); returns a waiter."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(result=_capture(fn)), daemon=True)
    thread.start()

    def wait(timeout_s: float = 600.0):
        thread.join(timeout_s)
        if thread.is_alive():
            raise SGLangPushError("SGLang did not answer the weight-group request in time")
        kind, value = box["result"]
        if kind == "error":
            raise value
        return value
    return wait


def _capture(fn):
    try:
        return "ok", fn()
    except Exception as exc:   # re-raised in the caller's thread by `wait`
        return "error", exc


def open_weight_group(url: str, master_address: str, master_port: int, world_size: int,
                      group_name: str = "weight_update_group", backend: str = "nccl",
                      admin_api_key: str | None = None, timeout_s: float = 300.0) -> WeightGroup:
    import torch.distributed.distributed_c10d as c10d
    body = init_group_request(master_address, master_port, world_size, 1, group_name, backend)
    http = httpx.Client(timeout=timeout_s)
    wait = _in_thread(lambda: post(http, url, "/init_weights_update_group", body, admin_api_key))
    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, _ = next(c10d.rendezvous(f"tcp://{master_address}:{master_port}", 0, world_size, timeout=timeout))
    pg, _ = c10d._new_process_group_helper(world_size, rank, [], c10d.Backend(backend),
                                           c10d.PrefixStore(group_name, store), group_name=group_name, timeout=timeout)
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    wait(timeout_s)
    http.close()
    return WeightGroup(pg, group_name, admin_api_key)


def push_over_group(url: str, group: WeightGroup, named: list[tuple[str, "torch.Tensor"]], selector: str,
                    weight_version: str | None = None, flush_cache: bool = False, timeout_s: float = 600.0) -> list[dict]:
    """A weight-update session whose tensors travel by broadcast from this process (rank 0)."""
    import torch.distributed as dist
    specs = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in named]
    (begin, begin_body), (path, body), (end, end_body) = distributed_requests(
        specs, selector, weight_version, flush_cache, group.group_name)
    with httpx.Client(timeout=timeout_s) as http:
        answers = [post(http, url, begin, begin_body, group.admin_api_key)]
        try:
            wait = _in_thread(lambda: post(http, url, path, body, group.admin_api_key))
            for _, tensor in named:    # the order SGLang allocates its receive buffers in
                dist.broadcast(tensor.detach().contiguous(), src=0, group=group.pg)
            answers.append(wait(timeout_s))
        finally:
            answers.append(post(http, url, end, end_body, group.admin_api_key))
    return answers


def close_weight_group(url: str, group: WeightGroup, timeout_s: float = 60.0) -> None:
    import torch.distributed as dist
    with httpx.Client(timeout=timeout_s) as http:
        post(http, url, "/destroy_weights_update_group", {"group_name": group.group_name}, group.admin_api_key)
    dist.destroy_process_group(group.pg)
