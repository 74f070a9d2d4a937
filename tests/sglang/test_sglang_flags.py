"""SGLang's own CLI parser (`ServerArgs.add_cli_args`) accepts the launch commands gleanrl builds
for a GPU with EAGLE-3 (`gleanrl serve --backend sglang --drafter ...`) and the compose file's
rollout command, so their flags and values exist in SGLang 0.5.23 even though SD itself cannot
start on CPU."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from gleanrl.server.sglang.launch import build_command
from sglang_util import run_in_sglang
from test_compose import COMPOSE, interpolate

pytestmark = pytest.mark.sglang

PARSE = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = []
for argv in json.loads(sys.argv[1]):
    ns = parser.parse_args(argv)
    out.append({k: getattr(ns, k) for k in ("model_path", "speculative_algorithm", "speculative_draft_model_path",
                                            "speculative_num_steps", "speculative_eagle_topk",
                                            "speculative_num_draft_tokens", "device", "dtype", "host", "port",
                                            "api_key", "admin_api_key", "context_length", "max_running_requests",
                                            "max_total_tokens", "skip_server_warmup", "mem_fraction_static")})
print(json.dumps(out))
"""


def test_sglang_parses_gleanrls_launch_commands():
    gpu = argparse.Namespace(
        model="/m/policy",
        drafter="/m/drafter",
        host="0.0.0.0",
        port=30001,
        api_key="a",
        admin_api_key="b",
        device="cuda",
        dtype="bfloat16",
        context_length=4096,
        max_running_requests=64,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        sglang_arg=["--mem-fraction-static", "0.8"],
    )
    cpu = argparse.Namespace(**{**vars(gpu), "drafter": None, "device": "cpu", "dtype": "auto", "sglang_arg": []})
    compose = yaml.safe_load(interpolate(COMPOSE.read_text(), {"GLEANRL_ADMIN_API_KEY": "k"}))
    argvs = [build_command(gpu)[3:], build_command(cpu)[3:], compose["services"]["rollout"]["command"][3:]]
    g, c, k = run_in_sglang(PARSE, json.dumps(argvs))
    assert (g["model_path"], g["speculative_algorithm"], g["speculative_draft_model_path"]) == (
        "/m/policy",
        "EAGLE3",
        "/m/drafter",
    )
    assert (g["speculative_num_steps"], g["speculative_eagle_topk"], g["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert (g["device"], g["dtype"], g["port"], g["api_key"], g["admin_api_key"]) == (
        "cuda",
        "bfloat16",
        30001,
        "a",
        "b",
    )
    assert (g["context_length"], g["max_running_requests"], g["mem_fraction_static"]) == (4096, 64, 0.8)
    assert (c["device"], c["dtype"], c["max_total_tokens"], c["skip_server_warmup"]) == ("cpu", "float32", 8192, True)
    assert c["speculative_algorithm"] is None
    assert (k["speculative_algorithm"], k["speculative_draft_model_path"], k["admin_api_key"]) == (
        "EAGLE3",
        "/models/drafter",
        "k",
    )
