"""Corrupt input on the control plane: a dozen kinds of bad checkpoint pushed with both selectors.
Each is a 4xx with the reason, the old weights keep serving (same greedy output) and neither version
changes. Extends test_http_errors / test_sd_engine_swap (missing, truncated, wider, other arch) with
the kinds they do not cover."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.tiny import make_tiny_model
from sd_util import random_drafter
from serving import running_server

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _weights(d: Path) -> Path:
    return next(d.glob("*.safetensors"))


def _rewrite(d: Path, fn) -> Path:
    w = _weights(d)
    save_file({k: fn(k, v) for k, v in load_file(str(w)).items()}, str(w), metadata={"format": "pt"})
    return d


def bad_checkpoints(good: Path, other_target: Path, root: Path, bad_dtype=torch.int32) -> dict[str, Path | str]:
    """kind -> a directory (or path string) that must be refused in place of `good`."""
    root.mkdir()
    bad: dict[str, Path | str] = {
        "missing dir": root / "nope",
        "path traversal": f"{root}/../../../../../../etc",
        "a file, not a dir": str(_weights(good)),
    }
    (root / "empty").mkdir()
    bad["empty dir"] = root / "empty"
    bad["config without weights"] = root / "noweights"
    bad["config without weights"].mkdir()
    shutil.copy(good / "config.json", root / "noweights" / "config.json")
    d = _copy(good, root / "truncated")
    _weights(d).write_bytes(_weights(d).read_bytes()[:700])
    d = _copy(good, root / "garbage")
    _weights(d).write_bytes(b"\xff" * 4096)
    bad["truncated safetensors"], bad["garbage safetensors"] = root / "truncated", d
    floats = lambda fn: lambda k, v: fn(v) if v.is_floating_point() else v  # noqa: E731
    # a float dtype is cast at load (a float32 update of a bf16 model); an integer one is wrong
    bad["wrong dtype"] = _rewrite(_copy(good, root / "dtype"), floats(lambda v: v.to(bad_dtype)))
    first = next(k for k, v in load_file(str(_weights(good))).items() if v.dim() == 2 and "embed" not in k)
    bad["wrong shape"] = _rewrite(_copy(good, root / "shape"), lambda k, v: v[:-1] if k == first else v)
    bad["missing tensor"] = _rewrite(_copy(good, root / "missing_t"), lambda k, v: v)
    w = load_file(str(_weights(bad["missing tensor"])))
    save_file(
        {k: v for k, v in w.items() if k != first}, str(_weights(bad["missing tensor"])), metadata={"format": "pt"}
    )
    bad["NaN weights"] = _rewrite(_copy(good, root / "nan"), floats(lambda v: torch.full_like(v, float("nan"))))
    d = _copy(good, root / "badjson")
    (d / "config.json").write_text("{ not json")
    bad["malformed config.json"] = d
    # unreadable weights: root reads any mode, so a dangling link
    d = _copy(good, root / "dangling")
    _weights(d).unlink()
    (d / _weights(good).name).symlink_to(root / "does-not-exist.safetensors")
    bad["unreadable weights"] = d
    d = _copy(good, root / "dirweights")
    _weights(d).unlink()
    (d / _weights(good).name).mkdir()
    bad["weights file is a directory"] = d
    bad["other target/architecture"] = other_target
    return bad


@pytest.fixture(scope="module")
def setup(tiny_qwen2, tiny_llama, tiny_tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("badckpt")
    drafter = random_drafter(tiny_qwen2, root / "drafter")
    narrow = make_tiny_model(root / "narrow", hidden_size=32, tokenizer=tiny_tokenizer)
    foreign_drafter = save_drafter(init_drafter(narrow), root / "foreign_drafter")
    return {
        "drafter": drafter,
        "target": bad_checkpoints(Path(tiny_qwen2), tiny_llama, root / "t"),
        # a float16/bfloat16 drafter is cast to the target's dtype on purpose
        # (SpecForge saves bf16)
        "draft": bad_checkpoints(drafter, foreign_drafter, root / "d") | {"target model as drafter": tiny_qwen2},
    }


def test_bad_checkpoints_are_refused_with_reason_and_nothing_changes(tiny_qwen2, setup):
    with running_server(
        tiny_qwen2,
        drafter=str(setup["drafter"]),
        sd="on",
        num_draft_tokens=3,
        api_key="k-user-77",
        admin_api_key="k-admin-88",
    ) as url:
        admin, user = {"Authorization": "Bearer k-admin-88"}, {"Authorization": "Bearer k-user-77"}

        def generate() -> dict:
            r = httpx.post(
                f"{url}/generate",
                headers=user,
                timeout=60,
                json={"text": "The quick brown fox", "sampling_params": GREEDY},
            )
            assert r.status_code == 200, r.text
            return r.json()

        before, info0 = generate(), httpx.get(f"{url}/model_info", headers=user, timeout=10).json()
        kinds = 0
        for selector in ("target", "draft"):
            for kind, path in setup[selector].items():
                r = httpx.post(
                    f"{url}/update_weights_from_disk",
                    headers=admin,
                    timeout=60,
                    json={"model_path": str(path), "selector": selector, "weight_version": "evil"},
                )
                assert 400 <= r.status_code < 500, (selector, kind, r.status_code, r.text)
                body = r.json()
                assert body["success"] is False and len(body["message"]) > 10, (selector, kind, body)
                assert "k-admin-88" not in r.text and "Traceback" not in body["message"]
                kinds += 1
        assert kinds >= 2 * 14
        info = httpx.get(f"{url}/model_info", headers=user, timeout=10).json()
        assert {k: info[k] for k in ("weight_version", "draft_weight_version", "model_path", "draft_model_path")} == {
            k: info0[k] for k in ("weight_version", "draft_weight_version", "model_path", "draft_model_path")
        }
        after = generate()
        assert after["output_ids"] == before["output_ids"] and after["meta_info"]["spec_verify_ct"] > 0
        meta = after["meta_info"]
        assert (meta["weight_version"], meta["draft_weight_version"]) == ("default", "default")
        good = httpx.post(
            f"{url}/update_weights_from_disk",
            headers=admin,
            timeout=60,
            json={"model_path": str(tiny_qwen2), "weight_version": "v1"},
        )
        # still updatable
        assert good.status_code == 200 and generate()["meta_info"]["weight_version"] == "v1"


def test_bad_checkpoint_kinds_are_distinct(setup):
    assert len(setup["target"]) >= 10 and len(setup["draft"]) >= 10
    cfg = json.loads((Path(setup["target"]["wrong dtype"]) / "config.json").read_text())
    assert cfg  # the dtype case keeps a valid config: only the tensors are wrong
