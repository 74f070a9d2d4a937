"""`base/flags.py`: flags generated from config dataclasses' fields. Every field of serve's, train's
and the harvest's configs has a flag (or is listed here as settable only in code or a config file),
and every flag those commands have is a field's or listed here as the command's own."""

from __future__ import annotations

import argparse
import dataclasses
import importlib

import pytest

from gleanrl import cli
from gleanrl.base.flags import add_flags, config_from_args, flag, flag_dests, given


@dataclasses.dataclass(slots=True)
class _Inner:
    depth: int = flag(3, "how deep", name="inner_depth")
    hidden: int = 0


@dataclasses.dataclass(slots=True)
class _Toy:
    path: str = flag(help="required one", name=("path", "path_alias"))
    n: int = flag(2, "a count")
    x: float = flag(0.5, "a ratio")
    mode: str | None = flag(None, "a mode", choices=["a", "b"])
    on: bool = flag(False, "a switch")
    keep: bool = flag(True, "on unless --no-keep")
    sources: tuple[str, ...] = flag(("eagle",), "comma-separated", sep=",")
    hosts: list[str] = flag(help="repeatable", metavar="HOST", default_factory=list)
    left: str | None = flag(None, "one side", exclusive="side")
    right: str | None = flag(None, "the other", exclusive="side")
    unflagged: int = 7
    inner: _Inner = dataclasses.field(default_factory=_Inner)


def _parser(**kw) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flags(parser, _Toy, **kw)
    return parser


def test_types_defaults_and_names():
    args = _parser().parse_args(["--path-alias", "p", "--n", "4", "--x", "2", "--mode", "b", "--on", "--no-keep"])
    assert (args.path, args.n, args.x, args.mode, args.on, args.keep) == ("p", 4, 2.0, "b", True, False)
    assert (args.sources, args.hosts, args.inner_depth) == ("eagle", [], 3)
    assert not hasattr(args, "unflagged") and not hasattr(args, "hidden")
    args = _parser().parse_args(["--sources", "eagle,,group", "--hosts", "h1", "--hosts", "h2"])
    values = given(_Toy, args)
    assert values["sources"] == ("eagle", "group") and values["hosts"] == ["h1", "h2"]
    assert values["inner.depth"] == 3 and "unflagged" not in values
    for bad in (["--mode", "c"], ["--n", "x"], ["--left", "l", "--right", "r"]):
        with pytest.raises(SystemExit):
            _parser().parse_args(bad)
    assert _parser(defaults={"n": 9}).parse_args([]).n == 9


def test_help_and_suppress():
    text = _parser(metavars={int: "N"}).format_help()
    assert "--path PATH, --path-alias PATH" in text and "--n N" in text and "--hosts HOST" in text
    assert "--mode {a,b}" in text and "--keep, --no-keep" in text and "[--left LEFT | --right RIGHT]" in text
    parser = _parser(suppress=True, prefix="_t:")
    assert vars(parser.parse_args([])) == {}  # absent unless given: a config file's value stands
    assert vars(parser.parse_args(["--n", "3"])) == {"_t:n": 3}
    assert given(_Toy, parser.parse_args(["--inner-depth", "1"]), "_t:") == {"inner.depth": 1}
    text = parser.format_help()
    assert "a count (default: 2)" in text and "one side\n" in text  # a None default is not shown


def test_dests_and_config_from_args():
    assert flag_dests(_Toy)["path"] == "path" and flag_dests(_Toy, "p:")["p:inner_depth"] == "inner.depth"
    assert "unflagged" not in flag_dests(_Toy).values()

    @dataclasses.dataclass(frozen=True)
    class Flat:
        a: int = flag(1, "a")
        tags: tuple[str, ...] = flag((), "tags", sep=",")

    parser = argparse.ArgumentParser()
    add_flags(parser, Flat)
    assert config_from_args(Flat, parser.parse_args(["--a", "5", "--tags", "x,y"])) == Flat(5, ("x", "y"))
    # a --config file may give a list where the flag takes a joined string
    assert config_from_args(Flat, argparse.Namespace(a=1, tags=["x", ""])) == Flat(1, ("x",))


def _fields(cls, path: str = "") -> set[str]:
    out = set()
    for f in dataclasses.fields(cls):
        nested = f.default_factory if isinstance(f.default_factory, type) else None
        if nested is not None and dataclasses.is_dataclass(nested):
            out |= _fields(nested, f"{path}{f.name}.")
        else:
            out.add(path + f.name)
    return out


def _dests(module: str) -> set[str]:
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    return {a.dest for a in parser._actions} - {"help"}


def _check(cls, dests: set[str], prefix: str, no_flag: set[str]) -> set[str]:
    """Every field of cls has a flag in dests, but those in no_flag (which have none); returns the
    dests that are cls's."""
    mine = flag_dests(cls, prefix)
    assert _fields(cls) - set(mine.values()) == no_flag, f"{cls.__name__}: fields without a flag"
    assert set(mine) <= dests, f"{cls.__name__}: flags missing from the parser"
    return set(mine)


# settable in code or a config file only
HARVEST_NO_FLAG = {"ttt_length", "bf16", "mid_step_capture", "seed", "versions_dir", "spool.max_mem_bytes"}
TRAIN_NO_FLAG = {
    "weight_decay",
    "betas",
    "grad_clip",
    "clip_low",
    "clip_high",
    "scale_advantages",
    "update_cores",
    "serve",
    "request_timeout_s",
    "max_attempts",
    "stream",
    "stream_interval",
}


def test_serve_flags_are_the_configs_fields():
    from gleanrl.server.config import ControllerConfig, EngineConfig
    from gleanrl.server.http.config import ServerConfig

    dests = _dests("gleanrl.server.cli")
    fields = _check(EngineConfig, dests, "", {"seed"}) | _check(ServerConfig, dests, "", set())
    _check(ControllerConfig, dests, "", set())
    own = {"config", "backend", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"}
    assert dests - fields == own | {"sglang_arg", "log_level"}


def test_train_and_harvest_flags_are_the_configs_fields():
    from gleanrl.harvest.config import HarvestConfig
    from gleanrl.trainer.cli import HARVEST
    from gleanrl.trainer.config import TrainConfig

    dests = _dests("gleanrl.trainer.cli")
    fields = _check(TrainConfig, dests, "", TRAIN_NO_FLAG) | _check(HarvestConfig, dests, HARVEST, HARVEST_NO_FLAG)
    assert dests - fields == {"config", "resume"}
    dests = _dests("gleanrl.sidecar.cli")
    fields = _check(HarvestConfig, dests, HARVEST, HARVEST_NO_FLAG)
    own = {"server", "admin_api_key", "api_key", "out", "drafter", "cold", "resume", "idle_running", "threads"}
    assert dests - fields == own | {"save_every_s", "poll_s"}


def _command_parsers(spec=cli.COMMANDS):
    for child in spec.values():
        if isinstance(child, dict):
            yield from _command_parsers(child)
        elif child[2:] != (cli.ARGV,):  # an ARGV command parses its own argv
            parser = argparse.ArgumentParser(prog=child[0], formatter_class=cli._Help)
            importlib.import_module(child[0]).add_arguments(parser)
            yield parser


def test_every_option_of_every_command_says_what_it_does():
    parsers = list(_command_parsers())
    assert len(parsers) >= 15
    for parser in parsers:
        undocumented = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
        assert not undocumented, (parser.prog, undocumented)
        text = parser.format_help()
        assert "(default: None)" not in text, parser.prog
