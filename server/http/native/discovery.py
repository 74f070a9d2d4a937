"""SGLang 0.5.23's discovery routes and answers: /model_info, /server_info, /get_load, /v1/loads. One
process serves one replica: tp, pp, dp and ep sizes are 1 (sglang-router's --dp-aware and slime read them)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gleanrl.server.http.edge.errors import ApiError
from gleanrl.server.weights import checkpoint

router = APIRouter()
PARALLEL = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "ep_size": 1, "nnodes": 1, "node_rank": 0}
PARALLEL |= {"enable_dp_attention": False, "enable_memory_saver": False}
LOAD_SECTIONS = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}


def _capacity(state) -> tuple[int, int]:
    """(max_running_requests, max_total_num_tokens): the KV a full running set may hold."""
    info = state.engine.info()
    running = int(info.get("max_running_requests") or 1)
    return running, running * int(state.context_length)


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request):
    state = request.app.state
    info = state.engine.info()
    return {
        "is_generation": True,
        "preferred_sampling_params": None,
        "served_model_name": state.served_model_name,
        "load_format": None,
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": _model_type(info.get("model_path")),
        **info,
    }


def _model_type(path: str | None) -> str | None:
    try:
        return checkpoint.read_config(path).get("model_type") if path else None
    except (OSError, ValueError):
        return None


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request):
    state = request.app.state
    stats = state.engine.stats()
    running, tokens = _capacity(state)
    return {
        **state.engine_args,
        **state.server_args,  # without the keys
        **PARALLEL,
        "max_running_requests": running,
        "max_total_tokens": tokens,
        "max_total_num_tokens": tokens,
        "context_length": state.context_length,
        "max_req_input_len": state.context_length - 1,
        "served_model_name": state.served_model_name,
        "internal_states": [{**stats, "avg_spec_accept_length": stats.get("avg_spec_accept_length", 0.0)}],
        "version": state.version,
        "backend": "embedded",
        "frontend": "python",
    }


def _load(state) -> dict:
    stats = state.engine.stats()
    running_max, tokens = _capacity(state)
    used = state.engine.used_tokens()
    return {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": stats["num_running_reqs"],
        "num_waiting_reqs": stats["num_queue_reqs"],
        "num_waiting_uncached_tokens": 0,
        "num_used_tokens": used,
        "num_total_tokens": used,
        "num_active_tokens": used,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": tokens,
        "max_running_requests": running_max,
        "token_usage": used / tokens if tokens else 0.0,
        "gen_throughput": 0.0,
        "cache_hit_rate": 0.0,
        "utilization": stats["num_running_reqs"] / running_max,
        "total_prefill_uncached_tokens": 0,
        "total_prefill_busy_us": 0,
        "decode_moments": None,
    }


@router.get("/get_load")
async def get_load(request: Request):
    """The per-DP-rank load list of SGLang before 0.5.23 (which answers 404 here; older
    sglang-router load-aware policies poll it)."""
    load = _load(request.app.state)
    waiting = load["num_waiting_reqs"]
    row = {"dp_rank": 0, "num_reqs": load["num_running_reqs"] + waiting, "num_waiting_reqs": waiting}
    return [row | {"num_tokens": load["num_used_tokens"]}]


@router.get("/v1/loads")
async def loads(request: Request, dp_rank: int | None = None, include: str | None = None, format: str | None = None):
    sections = {s.strip() for s in include.split(",")} if include else None
    if sections and not sections <= LOAD_SECTIONS:
        raise ApiError(
            400,
            f"Invalid include sections: {sections - LOAD_SECTIONS}. Valid options: {sorted(LOAD_SECTIONS)}",
            param="include",
        )
    state = request.app.state
    load = _load(state)
    every = sections is None or "all" in sections
    if every or "memory" in sections:
        zero = dict.fromkeys(("weight_gb", "kv_cache_gb", "graph_gb"), 0.0)
        load["memory"] = {**zero, "token_capacity": load["max_total_num_tokens"]}
    if state.engine.info().get("draft_model_path") and (every or "spec" in sections):  # SGLang: only with SD
        stats = state.engine.stats()
        load["speculative"] = {
            "accept_length": float(stats.get("avg_spec_accept_length", 0.0)),
            "accept_rate": float(stats.get("avg_spec_accept_rate", 0.0)),
        }
    if every or "disagg" in sections:
        queues = ("prefill_bootstrap", "prefill_inflight", "decode_prealloc", "decode_transfer", "decode_retracted")
        load["disaggregation"] = {
            "mode": "null",
            **{f"{q}_queue_reqs": 0 for q in queues},
            **dict.fromkeys(("kv_transfer_speed_gb_s", "kv_transfer_latency_ms"), 0.0),
        }
    if every or "queues" in sections:
        idle = dict.fromkeys(("grammar", "paused", "retracted", "prealloc_ready"), 0)
        load["queues"] = {"waiting": load["num_waiting_reqs"], **idle}
    rows = [load] if dp_rank in (None, 0) else []
    if format == "prometheus":
        lines = []
        for key, value in load.items():
            if isinstance(value, (int, float)) and key not in ("dp_rank", "timestamp"):
                lines += [f"# TYPE sglang_{key} gauge", f'sglang_{key}{{dp_rank="0"}} {value}']
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": state.version,
        "accelerator": None,
        "num_accelerators": 1,
        "loads": rows,
    }
