"""docs/structure.md's module map is the code's: every module listed once, none that is gone; and
every command-line entry point is a `gleanrl` command (no `python -m` side doors). The line width
is ruff's (pyproject.toml, one width for `ruff format` and `ruff check`, both run by .ci/run)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gleanrl.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gleanrl", "server", "harvest", "trainer", "clients", "base")
FOLDERS = (*PACKAGES, "scripts", "examples")  # the module map lists the scripts too; they are not commands
SKIP = ("__init__.py",)


def _modules(folders=FOLDERS) -> list[str]:
    return sorted(
        p.relative_to(ROOT).as_posix() for f in folders for p in (ROOT / f).rglob("*.py") if p.name not in SKIP
    )


def _listed() -> list[str]:
    text = (ROOT / "docs" / "structure.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.match(r"\| `([^`]+\.py)`", row).group(1) for row in rows]


def test_the_module_map_lists_every_module_once_and_none_that_is_gone():
    listed, modules = _listed(), _modules()
    twice = {m for m in listed if listed.count(m) > 1}
    assert not twice, f"listed twice: {twice}"
    assert sorted(set(modules) - set(listed)) == [], "missing from docs/structure.md"
    assert sorted(set(listed) - set(modules)) == [], "listed in docs/structure.md but gone"


def _commands(spec=COMMANDS) -> set[str]:
    out = set()
    for value in spec.values():
        out |= _commands(value) if isinstance(value, dict) else {value[0]}
    return out


def test_every_entry_point_is_in_the_dispatcher():
    commands = _commands()
    for rel in _modules(PACKAGES):
        tree = ast.parse((ROOT / rel).read_text())
        has_main = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
        defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if has_main or {"add_arguments", "run"} <= defs:
            dotted = rel[:-3].replace("/", ".")
            name = dotted if dotted.startswith("gleanrl.") else "gleanrl." + dotted
            assert name in commands or rel == "gleanrl/cli.py", f"{rel}: not in gleanrl/cli.py"
