"""The trainer–harvest seam: one typed protocol declares every hook the loop calls, `NoHooks` and
`HarvestHooks` implement all of them with the same parameters, the loop looks none up with
`hasattr`, and the embedded server's SD settings travel as typed config, not as edited argv."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest

from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.hooks import HOOKS, NoHooks, RolloutHooks, missing_hooks
from gleanrl.trainer.loop import train
from gleanrl.trainer.server_proc import EmbeddedServer, ServeSD

ROOT = Path(__file__).resolve().parent.parent


def test_the_protocol_declares_every_hook_no_hooks_implements():
    declared = {n for n in vars(RolloutHooks) if not n.startswith("_")}
    declared |= set(RolloutHooks.__annotations__)
    assert declared == set(HOOKS)
    assert isinstance(NoHooks(), RolloutHooks) and missing_hooks(NoHooks()) == []


@pytest.mark.parametrize("name", [n for n in HOOKS if n != "harvests"])
def test_harvest_hooks_implement_each_hook_with_the_same_parameters(name):
    def params(cls):
        return list(inspect.signature(getattr(cls, name)).parameters)

    assert params(HarvestHooks) == params(NoHooks)
    assert HarvestHooks.harvests is True and NoHooks.harvests is False


def test_the_trainer_looks_up_no_hook_by_name():
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("hasattr", "getattr"):
                named = getattr(node.args[0], "id", None)
                assert named != "hooks", f"{path}:{node.lineno}"


def test_train_refuses_hooks_that_lack_one(tiny_qwen2, tmp_path):
    class Partial:
        def on_step_start(self, step, model):
            pass

    with pytest.raises(TypeError, match="hooks lack harvests, load_state_dict, .*subclass NoHooks"):
        train(TrainConfig(model=str(tiny_qwen2), out=str(tmp_path)), hooks=Partial())
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_serve_sd_is_typed_and_extra_settings_still_win():
    with pytest.raises(ValueError, match="sd mode"):
        ServeSD("d", sd="fast")
    srv = EmbeddedServer("m", sd=ServeSD("/d"))
    cmd = srv.command()  # the settings go as a JSON file, not as flags
    assert cmd[-2:] == ["--config", str(srv.config_path)] and "--drafter" not in cmd
    settings = json.loads(srv.config_path.read_text())
    assert settings["drafter"] == "/d" and settings["sd"] == "adaptive" and settings["model"] == "m"
    assert EmbeddedServer("m", settings={"sd": "on"}, sd=ServeSD("/d")).settings()["sd"] == "on"
    assert "drafter" not in EmbeddedServer("m").settings()


def test_serve_reads_the_config_file_its_flags_win(tmp_path):
    import argparse

    from gleanrl.server.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = tmp_path / "serve.json"
    path.write_text(json.dumps({"model": "m", "sd": "on", "threads": 2, "dist_allow": ["h"]}))
    args = parser.parse_args(["--config", str(path), "--sd", "off"])
    assert (args.model, args.sd, args.threads, args.dist_allow) == ("m", "off", 2, ["h"])
    path.write_text(json.dumps({"model": "m", "modell": 1}))
    with pytest.raises(SystemExit):
        parser.parse_args(["--config", str(path)])
