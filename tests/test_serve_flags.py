"""`gleanrl serve`'s flags are the fields of ServerConfig and EngineConfig: one name and one
default per setting, from the flag to the dataclass (every field has its flag: tests/test_flags.py)."""

from __future__ import annotations

import argparse
import json

import pytest

from gleanrl.base.flags import config_from_args
from gleanrl.server.cli import add_arguments
from gleanrl.server.config import EngineConfig
from gleanrl.server.http.config import ServerConfig


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flag_defaults_are_the_dataclasses_defaults():
    args = _parse("--model", "m")
    assert config_from_args(ServerConfig, args) == ServerConfig()
    assert config_from_args(EngineConfig, args) == EngineConfig(model_path="m")


def test_flags_and_config_file_reach_the_dataclasses(tmp_path):
    args = _parse(
        "--model",
        "m",
        "--threads",
        "3",
        "--swap-timeout",
        "5",
        "--sd-sources",
        "eagle,group",
        "--dist-allow",
        "10.0.0.1",
        "--max-n",
        "7",
        "--chunked-prefill-size",
        "64",
    )
    engine, server = config_from_args(EngineConfig, args), config_from_args(ServerConfig, args)
    assert (engine.num_threads, engine.swap_timeout_s, engine.sd_sources) == (3, 5.0, ("eagle", "group"))
    assert engine.chunked_prefill_size == 64
    assert (server.dist_allow, server.max_n) == (("10.0.0.1",), 7)
    path = tmp_path / "serve.json"
    path.write_text(json.dumps({"model": "m", "sd_sources": ["eagle", "fused"]}))
    assert config_from_args(EngineConfig, _parse("--config", str(path))).sd_sources == ("eagle", "fused")
    with pytest.raises(ValueError, match="sd_sources"):
        config_from_args(EngineConfig, _parse("--model", "m", "--sd-sources", "eagle,nope"))
    with pytest.raises(ValueError, match="chunked_prefill_size"):
        config_from_args(EngineConfig, _parse("--model", "m", "--chunked-prefill-size", "0"))
