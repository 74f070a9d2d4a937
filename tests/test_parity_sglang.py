"""Structured-output parity with stock SGLang 0.5.23 (CPU), HTTP against HTTP
(scripts/parity_sglang.py, docs/parity.md): on greedy requests where both servers constrain the same
way (json_schema without free whitespace, regex) the texts are identical and valid on both."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from gleanrl.bench.serve_process import sglang_missing

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _parity():
    sys.path.insert(0, str(_SCRIPTS))  # the script imports its sibling parity_cases, as when run
    try:
        return importlib.import_module("parity_sglang")
    finally:
        sys.path.remove(str(_SCRIPTS))


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
