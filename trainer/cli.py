"""`gleanrl train`: GRPO against an embedded rollout server (default) or running ones (`--server`, `--router` for
generation through sglang-router), with harvest on when given `--drafter`. Harvest settings (`HarvestConfig`, the
"harvest" flag group) are stored in OUT/harvest/harvest_config.json, so `--resume` keeps them unless flags change them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gleanrl.base.flags import add_flags, given
from gleanrl.trainer.config import TrainConfig, build_config, read_config_file

HARVEST = "_harvest:"  # the dest prefix of the harvest settings' flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """TrainConfig's and the harvest's flags, absent unless given so that the config file's values stand."""
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last complete checkpoint in --out (and its harvest spool and drafter versions)",
    )
    parser.add_argument("--config", help="TOML/YAML file of TrainConfig fields; flags override it")
    add_flags(parser, TrainConfig, suppress=True)
    add_harvest_flags(parser.add_argument_group("harvest (with --drafter; kept by --resume)"))


def add_harvest_flags(group) -> None:
    """HarvestConfig's flags (train and harvest), absent unless given, as `_harvest:NAME`."""
    from gleanrl.harvest.config import HarvestConfig

    add_flags(group, HarvestConfig, prefix=HARVEST, suppress=True, metavars={int: "N", float: "X"})


def harvest_given(args: argparse.Namespace) -> dict:
    """The harvest flags given, by HarvestConfig field ("spool.NAME" for the spool's)."""
    from gleanrl.harvest.config import HarvestConfig

    return given(HarvestConfig, args, HARVEST)


def harvest_settings(cfg: TrainConfig, args: argparse.Namespace) -> None:
    """Write OUT/harvest/harvest_config.json: the resumed run's settings (or defaults), then the flags given.
    ValueError for flags without --drafter and for invalid values."""
    from gleanrl.harvest.config import update_config
    from gleanrl.trainer.checkpoint import list_checkpoints

    values = harvest_given(args)
    if not cfg.drafter:
        if values:
            flags = ["--" + k.removeprefix(HARVEST).replace("_", "-") for k in vars(args) if k.startswith(HARVEST)]
            raise ValueError(f"{', '.join(flags)}: harvest settings, which need --drafter")
        return
    root = Path(cfg.out) / "harvest"
    if not args.resume and list_checkpoints(cfg.out):
        return  # train() refuses a fresh run over an earlier one: leave that run's settings alone
    update_config(root, values, args.resume)


def run(args: argparse.Namespace) -> int:
    try:
        file_values = read_config_file(args.config) if args.config else {}
        cfg = build_config(file_values, given(TrainConfig, args))
        harvest_settings(cfg, args)
    except ValueError as exc:
        print(f"gleanrl train: {exc}", file=sys.stderr)
        return 2
    from gleanrl.clients.transport import RolloutServerError
    from gleanrl.trainer.loop import train

    try:
        row = train(cfg, resume=args.resume)
    except RolloutServerError as exc:
        print(f"gleanrl train: rollout server error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # a task spec, task file or checkpoint the user must fix
        print(f"gleanrl train: {exc}", file=sys.stderr)
        return 2
    if row:
        stats = f"step {row['step']}, reward {row['reward_mean']:.3f}, accuracy {row['accuracy']:.3f}"
        print(f"done: {stats}; checkpoints and metrics.jsonl in {cfg.out}")
    return 0
