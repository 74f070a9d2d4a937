"""`gleanrl harvest`: the harvest beside an RL trainer that is not gleanrl's, with no code in its loop.
It reads the server's feed of finished requests (`gleanrl serve --harvest-feed` or `gleanrl proxy`),
follows the policy it serves and runs `gleanrl train --drafter`'s harvester: capture with its own copy
of the policy, train in the server's idle windows, push a better drafter. A "step" is one policy version.
State (`OUT/sidecar_state.pt`) is saved atomically at each version, every `--save-every-s` and on
SIGINT/SIGTERM; after a kill -9, `--resume` re-reads the feed from the saved cursor.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import torch


def add_arguments(p) -> None:
    import os

    from gleanrl.trainer.cli import add_harvest_flags

    p.add_argument("--server", required=True, help="the rollout server (or `gleanrl proxy`) with its harvest feed")
    admin = "the server's admin key: reads the feed, pushes drafters (or env GLEANRL_ADMIN_API_KEY)"
    p.add_argument("--admin-api-key", default=os.environ.get("GLEANRL_ADMIN_API_KEY"), help=admin)
    key = "the server's API key, where it has one (or env GLEANRL_API_KEY)"
    p.add_argument("--api-key", default=os.environ.get("GLEANRL_API_KEY"), help=key)
    p.add_argument("--out", required=True, help="spool, drafter versions, settings, metrics.jsonl, state")
    init = p.add_mutually_exclusive_group(required=True)
    init.add_argument("--drafter", metavar="INIT", help="EAGLE-3 drafter to start from (the one the server serves)")
    init.add_argument("--cold", action="store_true", help="start from a random drafter (written to OUT/drafter_init)")
    p.add_argument("--resume", action="store_true", help="continue OUT's spool, drafter versions and feed cursor")
    idle = "train while at most this many requests run on the server (or it is paused)"
    p.add_argument("--idle-running", type=int, default=4, help=idle)
    p.add_argument("--threads", type=int, default=1, help="torch threads for capture and drafter training")
    p.add_argument("--save-every-s", type=float, default=60.0, help="state saved at least this often")
    p.add_argument("--poll-s", type=float, default=0.5, help="long-poll of the feed while nothing happens")
    add_harvest_flags(p.add_argument_group("harvest (kept by --resume)"))


def run(args) -> int:
    import httpx

    from gleanrl.harvest.config import update_config
    from gleanrl.sidecar.loop import STATE_FILE, FollowError, ServerView, Sidecar
    from gleanrl.trainer.cli import harvest_given

    out = Path(args.out)
    if args.idle_running < 0 or args.threads < 1 or args.save_every_s <= 0 or args.poll_s < 0:
        return _fail("--idle-running, --poll-s must be >= 0, --threads >= 1, --save-every-s > 0")
    if (out / STATE_FILE).exists() and not args.resume:
        return _fail(f"{out} holds an earlier sidecar run: pass --resume, or use another --out")
    # from here on SIGINT/SIGTERM stop cleanly, also while the policy loads
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    torch.set_num_threads(args.threads)
    view = ServerView(args.server, admin_api_key=args.admin_api_key, api_key=args.api_key)
    try:
        # OUT/harvest_config.json as `gleanrl train` writes it: the resumed run's settings, then the flags
        update_config(out, harvest_given(args), args.resume)
        sidecar = Sidecar(view, out, args)
    except (ValueError, FollowError, OSError, httpx.HTTPError) as exc:
        return _fail(f"{type(exc).__name__}: {exc}" if isinstance(exc, httpx.HTTPError) else str(exc))
    try:
        sidecar.run(stop)
    except FollowError as exc:
        return _fail(str(exc))
    finally:  # also on an unexpected error: the state so far is saved before it propagates
        sidecar.shutdown()
    print(f"gleanrl harvest: stopped; state in {out / STATE_FILE}", file=sys.stderr)
    return 0


def _fail(message: str) -> int:
    print(f"gleanrl harvest: error: {message}", file=sys.stderr)
    return 2
