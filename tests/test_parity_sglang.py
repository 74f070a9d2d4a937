"""Structured-output parity with stock SGLang 0.5.23 (CPU), HTTP against HTTP
(scripts/parity_sglang.py, docs/parity.md): on greedy requests where both servers constrain the same
way (json_schema without free whitespace, regex) the texts are identical and valid on both."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gleanrl.bench.sglang_arm import sglang_missing

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "parity_sglang.py"


def _parity():
    spec = importlib.util.spec_from_file_location("parity_sglang", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.sglang
@pytest.mark.timeout(600)
@pytest.mark.skipif(sglang_missing() is not None, reason=str(sglang_missing()))
def test_structured_outputs_match_stock_sglang(tmp_path):
    parity = _parity()
    model = parity.make_model(tmp_path / "model")
    rows = {r["case"]: r for r in parity.run_cases(model, ["json_native", "regex"])}
    assert set(rows) == {"json_native", "regex"}
    for name, r in rows.items():
        assert r["gleanrl_valid"] and r["sglang_valid"], (name, r)
        assert r["identical"], (name, r["gleanrl"], r["sglang"])
    assert parity.table(list(rows.values())).count("\n") == 3
