"""`gleanrl serve`: the embedded engine behind SGLang's native API and the OpenAI API, or stock SGLang (`--backend
sglang`, GPU). User mistakes end in a one-line error and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
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
    """`--config`, the flags of EngineConfig's and ServerConfig's fields (`base.flags`), the backend's."""
    from gleanrl.base.flags import add_flags
    from gleanrl.server.config import EngineConfig
    from gleanrl.server.http.config import ServerConfig

    p.add_argument(
        "--config",
        action=_ConfigFile,
        metavar="FILE.json",
        help='a JSON object of these settings by name (e.g. {"model": DIR, '
        '"sd_sources": "eagle,group"}), as flags at its place (later ones win)',
    )
    add_flags(p, EngineConfig)
    keys = {"api_key": os.environ.get("GLEANRL_API_KEY"), "admin_api_key": os.environ.get("GLEANRL_ADMIN_API_KEY")}
    add_flags(p, ServerConfig, defaults=keys)
    p.add_argument(
        "--backend",
        choices=["embedded", "sglang"],
        default="embedded",
        help="embedded PyTorch engine, or stock SGLang (GPU)",
    )
    g = p.add_argument_group("--backend sglang only")
    for name, what in (
        ("num-steps", "draft steps"),
        ("eagle-topk", "top-k draft tokens per step"),
        ("num-draft-tokens", "tokens verified per pass"),
    ):
        g.add_argument(f"--speculative-{name}", type=int, default=None, help=f"SGLang's: {what} (default: SGLang's)")
    g.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument passed to sglang.launch_server (repeatable)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity")


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
            from gleanrl.server.sglang.launch import launch  # lazy: needs the optional sglang install
        except ImportError as exc:
            return _fail(f"--backend sglang is not available here ({exc})")
        return int(launch(args) or 0)
    names = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    sglang_only = [f for f in names if getattr(args, f) is not None] + (["sglang_arg"] if args.sglang_arg else [])
    if sglang_only:  # refused, not ignored: the embedded engine's SD is --sd/--num-draft-tokens
        return _fail(
            ", ".join("--" + f.replace("_", "-") for f in sglang_only) + ": --backend "
            "sglang only (the embedded engine's SD: --sd, --num-draft-tokens)"
        )
    model = Path(args.model)
    if not (model / "config.json").is_file():
        return _fail(f"{model} is not a model directory (no config.json there)")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gleanrl.base.flags import config_from_args
    from gleanrl.server.config import EngineConfig
    from gleanrl.server.http.config import ServerConfig

    try:
        engine_cfg = config_from_args(EngineConfig, args)
        server_cfg = config_from_args(ServerConfig, args)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        from gleanrl.server.engine import Engine, EngineGone, EngineProcess

        stop = functools.partial(os.kill, os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown
        engine = EngineProcess(engine_cfg, on_exit=stop) if server_cfg.engine_process else Engine(engine_cfg)
    except EngineGone as exc:  # the engine process's one line
        return _fail(f"cannot load the model from {model}: {exc}")
    except Exception as exc:  # unloadable model: one line, no traceback
        return _fail(f"cannot load the model from {model}: {type(exc).__name__}: {exc}".splitlines()[0])
    import uvicorn

    from gleanrl.base.heap import freeze_heap
    from gleanrl.server.http.app import build_app

    app = build_app(engine, server_cfg, engine_cfg)
    freeze_heap()
    logging.info(
        "serving %s on http://%s:%d (auth: %s)", model, args.host, args.port, "api key" if args.api_key else "none"
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=10)
    except OSError as exc:  # e.g. the port is taken
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc}")
    return 0
