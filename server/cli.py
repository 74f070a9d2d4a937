"""`gleanrl serve`: the embedded engine behind SGLang's native API and the OpenAI API, or stock
SGLang (`--backend sglang`, GPU). User mistakes end in a one-line error and exit status 2, never
a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path


class _ConfigFile(argparse.Action):
    """`--config FILE.json`: each setting as if its flag were given here."""

    def __call__(self, parser, namespace, path, option_string=None) -> None:
        try:
            settings = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--config {path}: {exc}")
        known = {a.dest for a in parser._actions} - {"help", "config"}
        if not isinstance(settings, dict) or not set(settings) <= known:
            parser.error(f"--config {path}: not an object of known settings ({sorted(known)})")
        for name, value in settings.items():
            setattr(namespace, name, value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags named as the fields of ServerConfig and EngineConfig (but `--model`, `--threads` and
    `--swap-timeout`, `_RENAMED`), their defaults read from those dataclasses."""
    from gleanrl.server.config import EngineConfig
    from gleanrl.server.http.config import ServerConfig
    from gleanrl.server.http.reasoning import PARSERS
    from gleanrl.server.http.tool_parser import FORMATS

    default = {f.name: f.default for cls in (ServerConfig, EngineConfig) for f in dataclasses.fields(cls)}
    p.add_argument(
        "--config",
        action=_ConfigFile,
        metavar="FILE.json",
        help='a JSON object of these settings by name (e.g. {"model": DIR, '
        '"sd_sources": "eagle,group"}), as flags at its place (later ones win)',
    )
    p.add_argument(
        "--model",
        "--model-path",
        dest="model",
        help="Hugging Face model directory (safetensors, tokenizer, chat template); required",
    )
    p.add_argument("--host", default=default["host"], help="address to listen on")
    p.add_argument("--port", type=int, default=default["port"], help="port to listen on")
    p.add_argument("--device", choices=["cpu", "cuda"], default=default["device"], help="where the engine runs")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default=default["dtype"],
        help="auto: float32 on cpu, bfloat16 on cuda. On CPUs with AVX-512 BF16 (or "
        "AMX), bfloat16 decodes ~1.5-2x faster and makes speculative decoding pay "
        "(verify is memory-bound)",
    )
    p.add_argument(
        "--max-running-requests",
        type=int,
        default=default["max_running_requests"],
        help="requests decoding at once; the rest queue",
    )
    p.add_argument("--context-length", type=int, default=None, help="None: the model's max_position_embeddings")
    p.add_argument(
        "--api-key",
        default=os.environ.get("GLEANRL_API_KEY"),
        help="Bearer key for every route but /health (or env GLEANRL_API_KEY: not visible in ps)",
    )
    p.add_argument(
        "--admin-api-key",
        default=os.environ.get("GLEANRL_ADMIN_API_KEY"),
        help="Bearer key for weight updates, pause/continue, flush (or env GLEANRL_ADMIN_API_KEY)",
    )
    p.add_argument("--served-model-name", default=None, help="model name in /v1 (None: the directory's name)")
    p.add_argument("--drafter", default=None, help="EAGLE-3 drafter directory")
    p.add_argument("--sd", choices=["off", "on", "adaptive"], default=default["sd"], help="speculative decoding")
    p.add_argument(
        "--sd-max-batch",
        type=int,
        default=default["sd_max_batch"],
        help="adaptive: EAGLE-3 drafts only while this many requests run",
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        help="fixed EAGLE-3 draft length (None: chosen per iteration by the cost model)",
    )
    p.add_argument(
        "--sd-sources",
        default=",".join(default["sd_sources"]),
        help="draft sources the SD controller may choose per sequence: eagle (the "
        "EAGLE-3 chain), group (continuations from the same prompt's other running "
        "and earlier samples, no model cost), fused (both, as two branches "
        "verified in one pass); e.g. eagle,group,fused. Lossless either way, but "
        "with group drafts a seeded sample also depends on the other samples of "
        "its prompt, so seeded runs no longer repeat exactly",
    )
    p.add_argument(
        "--group-max-batch",
        type=int,
        default=default["group_max_batch"],
        help="group drafts only while this many requests run",
    )
    p.add_argument(
        "--group-max-tokens",
        type=int,
        default=default["group_max_tokens"],
        help="output tokens the group index holds over all prompts and versions "
        "(memory: 170-340 bytes a token; the oldest finished samples go first, "
        "then the oldest running ones)",
    )
    p.add_argument(
        "--group-keep-versions",
        type=int,
        default=default["group_keep_versions"],
        help="policy versions (weight_version) whose samples the group index keeps; "
        "older finished samples age out when a new target version is loaded",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads for the engine (None: torch's default)"
    )
    p.add_argument(
        "--backend",
        choices=["embedded", "sglang"],
        default="embedded",
        help="embedded PyTorch engine, or stock SGLang (GPU)",
    )
    g = p.add_argument_group("--backend sglang only")
    g.add_argument("--speculative-num-steps", type=int, default=None)
    g.add_argument("--speculative-eagle-topk", type=int, default=None)
    g.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    g.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument passed to sglang.launch_server (repeatable)",
    )
    p.add_argument(
        "--max-request-bytes", type=int, default=default["max_request_bytes"], help="request bodies over this: 413"
    )
    p.add_argument(
        "--max-n", type=int, default=default["max_n"], help="largest n (samples per prompt) a request may ask for"
    )
    p.add_argument(
        "--max-new-tokens-cap",
        type=int,
        default=None,
        help="largest max_new_tokens a request may ask for (default: only the context length limits it)",
    )
    p.add_argument(
        "--max-batch", type=int, default=default["max_batch"], help="most sequences (prompts x n) one request may start"
    )
    p.add_argument(
        "--harvest-feed",
        action="store_true",
        help="gleanrl extension: keep a bounded feed of finished requests at GET "
        "/harvest_feed (admin key) for `gleanrl harvest` beside a trainer that "
        "is not gleanrl's",
    )
    p.add_argument(
        "--harvest-feed-records",
        type=int,
        default=default["harvest_feed_records"],
        help="finished requests the feed holds; the oldest are dropped (and counted) beyond it",
    )
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=default["max_queued_requests"],
        help="requests waiting for a slot; beyond it /generate and /v1 answer 503 with Retry-After",
    )
    p.add_argument(
        "--max-top-logprobs-num",
        type=int,
        default=default["max_top_logprobs_num"],
        help="largest top_logprobs_num a request may ask",
    )
    p.add_argument(
        "--max-token-ids-logprob",
        type=int,
        default=default["max_token_ids_logprob"],
        help="most ids in token_ids_logprob",
    )
    p.add_argument(
        "--max-logprob-pairs",
        type=int,
        default=default["max_logprob_pairs"],
        help="(logprob, id) pairs the logprob options of one request may hold (positions x options)",
    )
    p.add_argument(
        "--swap-timeout",
        type=float,
        default=default["swap_timeout_s"],
        help="seconds a target weight update waits for running requests before it is refused",
    )
    p.add_argument(
        "--dist-allow",
        action="append",
        default=[],
        metavar="HOST",
        help="a process-group master_address /init_weights_update_group may join besides loopback (repeatable)",
    )
    p.add_argument(
        "--local-tensor-handles",
        action="store_true",
        help="/update_weights_from_tensor may carry fd / shared-memory handles (a "
        "trainer on this host, as SGLang's same-host path); off: "
        "tensors by value only",
    )
    p.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(PARSERS),
        help="separate <think>...</think> into reasoning_content on the chat route (SGLang's names)",
    )
    p.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(FORMATS),
        help="parse tool calls into tool_calls on the chat route (SGLang's names: "
        "qwen25 / qwen and hermes <tool_call> JSON, llama3 JSON)",
    )
    p.add_argument(
        "--constrained-json-disable-any-whitespace",
        action="store_true",
        help="json_schema output without free whitespace (SGLang's flag)",
    )
    p.add_argument(
        "--constrained-json-max-whitespace-cnt",
        type=int,
        default=None,
        help="most whitespace characters in a row in json_schema output (SGLang's flag)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


# EngineConfig field -> serve's flag (dest), where the names differ
_RENAMED = {"model_path": "model", "num_threads": "threads", "swap_timeout_s": "swap_timeout"}


def config_from_args(cls, args: argparse.Namespace):
    """A ServerConfig or EngineConfig from `gleanrl serve`'s arguments, field by field."""
    given = {}
    for f in dataclasses.fields(cls):
        dest = _RENAMED.get(f.name, f.name)
        if hasattr(args, dest):
            given[f.name] = getattr(args, dest)
    if isinstance(given.get("sd_sources"), str):  # a flag's "eagle,group"; --config: a list too
        given["sd_sources"] = given["sd_sources"].split(",")
    for name in ("sd_sources", "dist_allow"):
        if name in given:
            given[name] = tuple(x for x in given[name] if x)
    return cls(**given)


def _fail(message: str) -> int:
    print(f"gleanrl serve: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if not args.model:
        return _fail('--model is required (or "model" in --config)')
    if args.backend == "sglang":
        if getattr(args, "harvest_feed", False):
            return _fail(
                "--harvest-feed is the embedded backend's: in front of stock SGLang run "
                "`gleanrl proxy --upstream URL --port P`, which provides the same feed"
            )
        try:
            # lazy: needs the optional sglang install
            from gleanrl.server.sglang.launch import launch
        except ImportError as exc:
            return _fail(f"--backend sglang is not available here ({exc})")
        return int(launch(args) or 0)
    sglang_only = [
        f
        for f in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
        if getattr(args, f) is not None
    ] + (["sglang_arg"] if args.sglang_arg else [])
    if sglang_only:  # refused, not ignored: the embedded engine's SD is --sd/--num-draft-tokens
        return _fail(
            ", ".join("--" + f.replace("_", "-") for f in sglang_only) + ": --backend "
            "sglang only (the embedded engine's SD: --sd, --num-draft-tokens)"
        )
    model = Path(args.model)
    if not (model / "config.json").is_file():
        return _fail(f"{model} is not a model directory (no config.json there)")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gleanrl.server.config import EngineConfig
    from gleanrl.server.http.config import ServerConfig

    try:
        engine_cfg = config_from_args(EngineConfig, args)
        server_cfg = config_from_args(ServerConfig, args)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        from gleanrl.server.engine import Engine

        engine = Engine(engine_cfg)
    except Exception as exc:  # unloadable model: one line, no traceback
        return _fail(f"cannot load the model from {model}: {type(exc).__name__}: {exc}".splitlines()[0])
    import uvicorn

    from gleanrl.server.http.app import build_app

    app = build_app(engine, server_cfg, engine_cfg)
    logging.info(
        "serving %s on http://%s:%d (auth: %s)", model, args.host, args.port, "api key" if args.api_key else "none"
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=10)
    except OSError as exc:  # e.g. the port is taken
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc}")
    return 0
