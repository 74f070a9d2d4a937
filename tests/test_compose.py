"""docker-compose.yml checked without a Docker engine: the structure Compose needs (services,
profiles, volumes, health-gated dependencies, shared paths) and every gleanrl command in it parsed
by gleanrl's own CLI parser. SGLang's command is parsed by SGLang's own parser in
tests/sglang/test_compose_sglang.py; with the optional `compose-spec` package (the Rust compose_spec
parser) the whole file is validated too."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest
import yaml

import gleanrl.cli

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-?])([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} substitution."""

    def sub(m: re.Match) -> str:
        name, op, arg = m.groups()
        if env.get(name):
            return env[name]
        if op == "?":
            raise ValueError(f"{name}: {arg}")
        return arg or ""

    return _VAR.sub(sub, text)


def load(env: dict[str, str] | None = None) -> dict:
    return yaml.safe_load(interpolate(COMPOSE.read_text(), {"GLEANRL_ADMIN_API_KEY": "k", **(env or {})}))


def gleanrl_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gleanrl")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, spec in gleanrl.cli.COMMANDS.items():
        gleanrl.cli._add(sub, name, spec)
    return parser


def test_services_profiles_and_images():
    c = load()
    assert set(c["services"]) == {"rollout", "rollout-cpu", "trainer"}
    rollout, cpu, trainer = (c["services"][s] for s in ("rollout", "rollout-cpu", "trainer"))
    assert rollout["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"] and set(trainer["profiles"]) == {"gpu", "cpu"}
    assert rollout["image"].startswith("lmsysorg/sglang:")
    assert rollout["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    for svc in (cpu, trainer):
        assert (
            svc["image"] == "gleanrl:latest" and (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
        )
    assert load({"SGLANG_IMAGE": "mirror/sglang:x"})["services"]["rollout"]["image"] == "mirror/sglang:x"
    with pytest.raises(ValueError, match="GLEANRL_ADMIN_API_KEY"):
        yaml.safe_load(interpolate(COMPOSE.read_text(), {}))


def test_rollout_runs_sglang_with_the_mounted_policy_and_eagle3_drafter():
    rollout = load()["services"]["rollout"]
    cmd = rollout["command"]
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    flags = dict(a.split("=", 1) for a in cmd[3:])
    assert flags["--model-path"] == "/models/policy" and flags["--speculative-algorithm"] == "EAGLE3"
    assert flags["--speculative-draft-model-path"] == "/models/drafter" and flags["--admin-api-key"] == "k"
    assert {"/models", "/ckpt"} <= {v.split(":")[1] for v in rollout["volumes"]}


def test_every_service_volume_is_declared_and_checkpoints_are_shared():
    c = load()
    for name, svc in c["services"].items():
        for vol in svc.get("volumes", []):
            source, target = vol.split(":")[:2]
            assert source.startswith((".", "/")) or source in c["volumes"], (name, source)
            if target == "/ckpt":
                assert source == "checkpoints", name
    out = c["services"]["trainer"]["command"]
    assert out[out.index("--out") + 1].startswith("/ckpt/")  # the path the server loads from


def test_trainer_waits_for_a_healthy_rollout_server_it_can_reach():
    c = load()
    trainer = c["services"]["trainer"]
    for dep, cond in trainer["depends_on"].items():
        assert dep in c["services"] and cond["condition"] == "service_healthy" and cond["required"] is False
        assert "test" in c["services"][dep]["healthcheck"]
        assert "rollout-server" in c["services"][dep]["networks"]["default"]["aliases"]
    cmd = trainer["command"]
    assert cmd[cmd.index("--server") + 1] == "http://rollout-server:30000"


def test_gleanrl_commands_parse_with_gleanrl_cli():
    c = load()
    parser = gleanrl_parser()
    serve = parser.parse_args(c["services"]["rollout-cpu"]["command"])
    assert serve.model == "/models/policy" and serve.drafter == "/models/drafter" and serve.port == 30000
    train = parser.parse_args(c["services"]["trainer"]["command"])
    assert train.server == ["http://rollout-server:30000"] and train.resume
    with pytest.raises(SystemExit):
        # the parser does reject unknown flags
        parser.parse_args(["serve", "--no-such-flag"])


def test_compose_spec_parser_accepts_the_file():
    compose_spec = pytest.importorskip(
        "compose_spec", reason="optional: pip install compose-spec for a full Compose-spec validation"
    )
    text = interpolate(COMPOSE.read_text(), {**os.environ, "GLEANRL_ADMIN_API_KEY": "k"})
    assert compose_spec.PyCompose.from_yaml(text).service_names() == ["rollout", "rollout-cpu", "trainer"]
