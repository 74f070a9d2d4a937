"""`gleanrl train` flags fill TrainConfig (flags override the config file; flags not
given leave it)."""

from __future__ import annotations

import argparse

from gleanrl.base.flags import given
from gleanrl.trainer.cli import add_arguments
from gleanrl.trainer.config import TrainConfig, build_config, read_config_file


def _config(argv, tmp_path, tiny_llama, file_text=""):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg_file = tmp_path / "rl.toml"
    cfg_file.write_text(f'model = "{tiny_llama}"\nout = "{tmp_path / "out"}"\n' + file_text)
    args = parser.parse_args(["--config", str(cfg_file), *argv])
    return build_config(read_config_file(args.config), given(TrainConfig, args))


def test_recipe_flags_reach_the_config(tiny_llama, tmp_path):
    cfg = _config(["--negative-weight", "0.1", "--eval-greedy", "--eval-every", "3"], tmp_path, tiny_llama)
    assert (cfg.negative_weight, cfg.eval_greedy, cfg.eval_every) == (0.1, True, 3)
    cfg = _config([], tmp_path, tiny_llama, "negative_weight = 0.5\neval_greedy = true\n")
    assert (cfg.negative_weight, cfg.eval_greedy) == (0.5, True)
    cfg = _config(["--negative-weight", "0.2"], tmp_path, tiny_llama, "negative_weight = 0.5\n")
    assert cfg.negative_weight == 0.2


def test_repeated_server_flags_fill_servers(tiny_llama, tmp_path):
    cfg = _config(["--server", "http://a:1", "--server", "http://b:2"], tmp_path, tiny_llama)
    assert cfg.servers == ["http://a:1", "http://b:2"]
