"""The `gleanrl` command: a thin dispatcher. Each subcommand is a module exposing `add_arguments(parser)`
and `run(args) -> int`; one that parses its own argv (`main(argv) -> int`) is marked `ARGV` and gets the
rest of the command line, `--help` included."""

from __future__ import annotations

import argparse
import importlib
import sys

ARGV = "argv"  # a spec's third field: the module's own `main(argv)` parses the rest of the line

# name -> (module, one-line help[, ARGV]). Nested groups map to a dict of the same shape.
COMMANDS: dict = {
    "serve": ("gleanrl.server.cli", "serve a policy (and drafter) over SGLang's native API and the OpenAI API"),
    "proxy": ("gleanrl.server.proxy.app", "forward to an SGLang-API server unchanged and provide the harvest feed"),
    "harvest": ("gleanrl.sidecar.cli", "harvest a drafter beside any RL trainer, from the server's feed"),
    "make-tiny-model": ("gleanrl.tiny", "write a tiny random Qwen2/Llama model with a locally trained tokenizer"),
    "bootstrap": ("gleanrl.trainer.bootstrap", "train the built-in task's small policy from scratch (cached)"),
    "train": ("gleanrl.trainer.cli", "GRPO training against a rollout server, harvesting a drafter in the long tail"),
    "demo": ("gleanrl.demo", "bootstrap, warm-start a drafter, train with harvest, serve and ask (CPU)"),
    "measure": ("gleanrl.trainer.tasks.measure", "response lengths and accuracy of a policy on a task, at T=1", ARGV),
    "draft": {
        "init": ("gleanrl.harvest.cli_init", "write a randomly initialised EAGLE-3 drafter for a target"),
        "train": ("gleanrl.draft_train", "warm-start an EAGLE-3 drafter offline from the target's generations"),
    },
    "bench": {
        "engine": ("gleanrl.bench.engine", "gleanrl serve vs stock SGLang CPU over HTTP; ms per decode iteration"),
        "layout": ("gleanrl.bench.layout", "plain decode per running count at 1 and N threads; a GRPO step per layout"),
        "sd": ("gleanrl.bench.sd", "speculative decoding vs plain decoding in the embedded engine"),
        "rollout": ("gleanrl.bench.rollout", "GRPO rollouts: plain / EAGLE-3 / group drafts / fused, side by side"),
        "e2e": ("gleanrl.bench.e2e", "end-to-end RL steps: no SD vs adaptive, stale, cold and off-domain drafters"),
        "load": ("gleanrl.bench.load", "many concurrent clients, streaming and not, some leaving: errors, leaks, RSS"),
        "swaps": ("gleanrl.bench.swaps", "alternating target and draft weight swaps under load: versions and outputs"),
        "crash": ("gleanrl.bench.crash", "kill -9 the trainer at random points and resume: nothing lost"),
        "group-index": ("gleanrl.bench.group_index", "the group index's cost per propose and extend call"),
    },
}


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default once: none for None, none after a help that names its own."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _add(sub, name: str, spec) -> None:
    if isinstance(spec, dict):
        group = sub.add_parser(name, help=f"{name} subcommands")
        inner = group.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
        for child, child_spec in spec.items():
            _add(inner, child, child_spec)
        return
    module, help_text, *kind = spec
    if kind == [ARGV]:  # listed here; `main` hands it its argv before this parser runs
        sub.add_parser(name, help=help_text)
        return
    parser = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_Help)
    parser.set_defaults(_module=module)
    importlib.import_module(module).add_arguments(parser)


def _own_argv(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, the rest of argv) when argv names an ARGV command."""
    spec, i = COMMANDS, 0
    while isinstance(spec, dict) and i < len(argv) and argv[i] in spec:
        spec, i = spec[argv[i]], i + 1
    return (spec[0], argv[i:]) if isinstance(spec, tuple) and spec[2:] == (ARGV,) else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if own := _own_argv(argv):
        return int(importlib.import_module(own[0]).main(own[1]) or 0)
    parser = argparse.ArgumentParser(
        prog="gleanrl",
        epilog="Each command has --help. Docs: README.md and docs/ in the repository.",
        description="gleanrl: faster RL training of reasoning LLMs. A drafter harvested from finished rollouts is "
        "hot-swapped into the rollout server, so the long tail decodes faster with lossless speculative decoding; "
        "the same server then serves the final policy and drafter.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, spec in COMMANDS.items():
        _add(sub, name, spec)
    args = parser.parse_args(argv)
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
