"""`gleanrl train`: GRPO against an embedded rollout server (default) or running ones (`--server`,
and `--router` for generation through sglang-router), with harvest on when given `--drafter`.

Cores (`trainer.layout`): `--replicas` embedded servers (default one per core on CPU), each pinned to
its share with one torch thread per core (`--server-threads`); with harvest the drafter trains on the
cores of replicas that have nothing left to run, with `--trainer-threads` (default 1); the policy
update takes every core (`--update-threads`).

Harvest settings (`HarvestConfig`, flags of the "harvest" group) are stored in
OUT/harvest/harvest_config.json, so `--resume` keeps them unless flags change them."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from gleanrl.trainer.config import TrainConfig, build_config, read_config_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=argparse.SUPPRESS, help="initial policy (Hugging Face directory)")
    parser.add_argument(
        "--out",
        default=argparse.SUPPRESS,
        help="output directory: checkpoints weight_v{N}, metrics.jsonl, resolved config",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--task",
        default=argparse.SUPPRESS,
        help="built-in task name, jsonl:PATH or module:object (default: the built-in task)",
    )
    source.add_argument("--data", default=argparse.SUPPRESS, help="JSONL prompt file instead of a task")
    parser.add_argument(
        "--server",
        action="append",
        dest="servers",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="a running rollout server (repeat for several); default: start an embedded one",
    )
    parser.add_argument(
        "--router",
        default=argparse.SUPPRESS,
        metavar="URL",
        help="send generation through this router (sglang-router); weight updates still go to every --server worker",
    )
    parser.add_argument(
        "--drafter",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="EAGLE-3 drafter: harvest on (hidden states of finished rollouts "
        "train it while the step waits on its tail; better versions are "
        "pushed to the servers); the embedded server serves it with --sd "
        "adaptive; state in OUT/harvest",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last complete checkpoint in --out (and its harvest spool and drafter versions)",
    )
    parser.add_argument("--config", help="TOML/YAML file of TrainConfig fields; flags override it")
    for f in dataclasses.fields(TrainConfig):
        if "help" in f.metadata:  # not given: absent, so the file's value stands
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                dest=f.name,
                default=argparse.SUPPRESS,
                **{**f.metadata, "help": (f"{f.metadata['help']} (default: {f.default})")},
            )
    add_harvest_flags(parser.add_argument_group("harvest (with --drafter; kept by --resume)"))


def harvest_flags() -> dict[str, tuple[str, dataclasses.Field]]:
    """flag -> (HarvestConfig field, "spool." for SpoolConfig's; the field): those with a help."""
    from gleanrl.harvest.harvester import HarvestConfig
    from gleanrl.harvest.spool import SpoolConfig

    return {
        f.metadata["flag"] or "--" + f.name.replace("_", "-"): (prefix + f.name, f)
        for cls, prefix in ((HarvestConfig, ""), (SpoolConfig, "spool."))
        for f in dataclasses.fields(cls)
        if "help" in f.metadata
    }


def add_harvest_flags(group) -> None:
    """The harvest settings' flags (`harvest.spool.flagged`), each stored as `_harvest:FIELD` when
    given (train and harvest)."""
    for flag, (name, f) in harvest_flags().items():
        choices = f.metadata["choices"]
        group.add_argument(
            flag,
            dest=f"_harvest:{name}",
            type=type(f.default),
            default=argparse.SUPPRESS,
            choices=choices,
            metavar=None if choices else {int: "N", float: "X"}[type(f.default)],
            help=f"{f.metadata['help']} (default: {f.default})",
        )


def harvest_settings(cfg: TrainConfig, args: argparse.Namespace) -> None:
    """Write OUT/harvest/harvest_config.json: the resumed run's settings (or the defaults), then the
    flags given. Raises ValueError for flags without --drafter and for invalid values."""
    from gleanrl.harvest.hooks import update_config
    from gleanrl.trainer.checkpoint import list_checkpoints

    given = {k.split(":", 1)[1]: v for k, v in vars(args).items() if k.startswith("_harvest:")}
    if not cfg.drafter:
        if given:
            flags = [flag for flag, (name, _) in harvest_flags().items() if name in given]
            raise ValueError(f"{', '.join(flags)}: harvest settings, which need --drafter")
        return
    root = Path(cfg.out) / "harvest"
    if not args.resume and list_checkpoints(cfg.out):
        return  # train() refuses a fresh run over an earlier one: leave that run's settings alone
    update_config(root, given, args.resume)


def run(args: argparse.Namespace) -> int:
    try:
        file_values = read_config_file(args.config) if args.config else {}
        flags = {k: v for k, v in vars(args).items() if not k.startswith("_")}
        cfg = build_config(file_values, flags)
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
        print(
            f"done: step {row['step']}, reward {row['reward_mean']:.3f}, "
            f"accuracy {row['accuracy']:.3f}; checkpoints and metrics.jsonl in {cfg.out}"
        )
    return 0
