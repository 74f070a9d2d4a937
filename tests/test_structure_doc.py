"""docs/structure.md's module map is the code's: every module listed once, none that is gone; and
every command-line entry point is a `gleanrl` command (no `python -m` side doors); and the Python
files stay narrow: at most 3 % of their lines exceed 100 columns (issue 25)."""
from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

from gleanrl.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("gleanrl", "server", "harvest", "trainer", "clients", "base")
SKIP = ("__init__.py",)
WIDE, WIDE_SHARE = 100, 0.03  # columns; the share of lines allowed beyond them
NOT_SOURCE = {".git", "build", "dist", "__pycache__", "node_modules"}


def _modules() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for f in FOLDERS for p in (ROOT / f).rglob("*.py")
                  if p.name not in SKIP)


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
    for rel in _modules():
        tree = ast.parse((ROOT / rel).read_text())
        has_main = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
                       for n in tree.body)
        defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if has_main or {"add_arguments", "run"} <= defs:
            dotted = rel[:-3].replace("/", ".")
            name = dotted if dotted.startswith("gleanrl.") else "gleanrl." + dotted
            assert name in commands or rel == "gleanrl/cli.py", f"{rel}: not in gleanrl/cli.py"


def _python_files() -> list[Path]:
    """The repository's Python files: `git ls-files`, or without git a walk that skips virtualenvs,
    build output and caches."""
    try:
        out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=60).stdout
        files = [ROOT / name for name in out.splitlines()]
    except (OSError, subprocess.SubprocessError):
        files = []
    if not files:
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in NOT_SOURCE and not d.startswith(".venv")
                       and not d.endswith(".egg-info")]
            files += [Path(folder) / name for name in names if name.endswith(".py")]
    return sorted(p for p in files if p.is_file())


def test_at_most_3_percent_of_python_lines_exceed_100_columns():
    wide, total = {}, 0
    for path in _python_files():
        lines = path.read_text(encoding="utf-8").splitlines()
        total += len(lines)
        if n := sum(len(line) > WIDE for line in lines):
            wide[path.relative_to(ROOT).as_posix()] = n
    count = sum(wide.values())
    worst = sorted(wide.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    assert total and count <= WIDE_SHARE * total, (
        f"{count} of {total} Python lines ({count / max(total, 1):.1%}) exceed {WIDE} columns, "
        f"more than {WIDE_SHARE:.0%}; the most in: {worst}")
