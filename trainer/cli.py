"""`gleanrl train`: GRPO against an embedded rollout server (default) or running ones (`--server`, and
`--router` for generation through sglang-router), with harvest on when given `--drafter`.

Cores: the embedded server runs with `--server-threads` torch threads (default 1) and the trainer with
`--trainer-threads` (default 1), which suits a 2-core machine."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from trainer.config import TrainConfig, build_config, read_config_file

# flag -> (TrainConfig field, type, help). Defaults live in TrainConfig; a flag not given is None.
FLAGS = {
    "--steps": ("steps", int, "RL steps"),
    "--prompts-per-step": ("prompts_per_step", int, "prompts per step"),
    "--samples-per-prompt": ("samples_per_prompt", int, "rollouts per prompt (GRPO group size)"),
    "--max-new-tokens": ("max_new_tokens", int, "rollout length cap"),
    "--temperature": ("temperature", float, "sampling temperature"),
    "--top-p": ("top_p", float, "top-p"),
    "--lr": ("lr", float, "AdamW learning rate"),
    "--micro-batch-size": ("micro_batch_size", int, "sequences per forward/backward"),
    "--kl-coef": ("kl_coef", float, "k3 KL to the initial policy (0: off)"),
    "--eval-every": ("eval_every", int, "accuracy on held-out prompts every N steps (0: off)"),
    "--eval-prompts": ("eval_prompts", int, "held-out prompts per evaluation"),
    "--eval-samples": ("eval_samples", int, "samples per held-out prompt"),
    "--eval-temperature": ("eval_temperature", float, "evaluation temperature (0: greedy)"),
    "--keep-last": ("keep_last", int, "step checkpoints kept"),
    "--seed": ("seed", int, "seed"),
    "--trainer-threads": ("trainer_threads", int, "torch threads of the trainer"),
    "--server-threads": ("server_threads", int, "torch threads of the embedded server"),
    "--api-key": ("api_key", str, "the rollout server's API key"),
    "--admin-api-key": ("admin_api_key", str, "the rollout server's admin API key (weight updates)"),
    "--server-wait-s": ("server_wait_s", float, "how long to wait for a dead or restarting server"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=argparse.SUPPRESS, help="initial policy (Hugging Face directory)")
    parser.add_argument("--out", default=argparse.SUPPRESS,
                        help="output directory: checkpoints weight_v{N}, metrics.jsonl, resolved config")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--task", default=argparse.SUPPRESS,
                        help="built-in task name, jsonl:PATH or module:object (default: the built-in task)")
    source.add_argument("--data", default=argparse.SUPPRESS, help="JSONL prompt file instead of a task")
    parser.add_argument("--server", action="append", dest="servers", metavar="URL",
                        default=argparse.SUPPRESS,
                        help="a running rollout server (repeat for several); default: start an embedded one")
    parser.add_argument("--router", default=argparse.SUPPRESS, metavar="URL",
                        help="send generation through this router (sglang-router); weight updates still go "
                             "to every --server worker")
    parser.add_argument("--drafter", default=argparse.SUPPRESS, metavar="DIR",
                        help="EAGLE-3 drafter: harvest on (hidden states of finished rollouts train it while the "
                             "step waits on its tail; better versions are pushed to the servers); the embedded "
                             "server serves it with --sd adaptive; state in OUT/harvest")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the last complete checkpoint in --out (and its harvest spool and "
                             "drafter versions)")
    parser.add_argument("--config", help="TOML/YAML file of TrainConfig fields; flags override it")
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for flag, (dest, typ, help_text) in FLAGS.items():  # not given: absent, so the file's value stands
        parser.add_argument(flag, dest=dest, type=typ, default=argparse.SUPPRESS,
                            help=f"{help_text} (default: {defaults[dest]})")


def run(args: argparse.Namespace) -> int:
    try:
        file_values = read_config_file(args.config) if args.config else {}
        flags = {k: v for k, v in vars(args).items() if not k.startswith("_")}
        cfg = build_config(file_values, flags)
    except ValueError as exc:
        print(f"gleanrl train: {exc}", file=sys.stderr)
        return 2
    from clients.rollout_client import RolloutServerError
    from trainer.loop import train
    try:
        row = train(cfg, resume=args.resume)
    except RolloutServerError as exc:
        print(f"gleanrl train: rollout server error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # a task spec, task file or checkpoint the user must fix
        print(f"gleanrl train: {exc}", file=sys.stderr)
        return 2
    if row:
        print(f"done: step {row['step']}, reward {row['reward_mean']:.3f}, accuracy {row['accuracy']:.3f}; "
              f"checkpoints and metrics.jsonl in {cfg.out}")
    return 0
