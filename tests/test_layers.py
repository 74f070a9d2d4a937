"""The one-way import rule of DESIGN.md (Layout), checked on the source with the AST, lazy imports
(inside functions) included: top layer -> anything; trainer -> clients, harvest; server -> the harvest
modules that define the drafter and its checkpoint format; harvest and clients -> nothing of the project."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("server", "harvest", "trainer", "clients")
ALLOWED: dict[str, set[str]] = {
    "clients": set(),
    "harvest": set(),
    "server": {"harvest.drafter", "harvest.drafter_config", "harvest.checkpoint", "harvest.atomic"},
    "trainer": {"clients", "harvest"},
}


def _allowed(comp: str, target: str) -> bool:
    """target: a module path below `gleanrl.` (e.g. 'harvest.drafter', 'bench.sd')."""
    if target == comp or target.startswith(comp + "."):
        return True
    return any(target == a or target.startswith(a + ".") for a in ALLOWED[comp])


def violations(root: Path) -> list[str]:
    bad = []
    for comp in COMPONENTS:
        for path in sorted((root / comp).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods = [node.module]
                    if node.module == "gleanrl":  # `from gleanrl import server` names submodules
                        mods = [f"gleanrl.{alias.name}" for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level > 1:
                    mods = ["gleanrl.<relative import above its component>"]
                else:
                    continue
                for mod in mods:
                    head = mod.split(".")[0]
                    where = f"{path.relative_to(root)}:{node.lineno} imports {mod}"
                    if head in COMPONENTS:
                        bad.append(where + " (a top-level name: import it as gleanrl." + mod + ")")
                    elif head == "gleanrl" and not _allowed(comp, mod.partition(".")[2]):
                        bad.append(where)
    return bad


def test_components_import_one_way():
    assert violations(ROOT) == []


def test_checker_catches_forbidden_imports(tmp_path):
    for comp in COMPONENTS:
        (tmp_path / comp).mkdir()
    (tmp_path / "server" / "ok.py").write_text("from gleanrl.harvest.drafter import Eagle3Drafter\n"
                                               "from gleanrl.server.kv import SeqKVCache\nimport torch\n")
    (tmp_path / "clients" / "bad.py").write_text("def f():\n    from gleanrl.trainer.loop import train\n")
    (tmp_path / "harvest" / "bad.py").write_text("import gleanrl.clients.rollout_client\n")
    (tmp_path / "server" / "bad.py").write_text("from gleanrl.harvest.harvester import Harvester\n"
                                                "from gleanrl import bench\nimport trainer.tasks\n")
    found = violations(tmp_path)
    assert found == [
        "server/bad.py:1 imports gleanrl.harvest.harvester",
        "server/bad.py:2 imports gleanrl.bench",
        "server/bad.py:3 imports trainer.tasks (a top-level name: import it as gleanrl.trainer.tasks)",
        "harvest/bad.py:1 imports gleanrl.clients.rollout_client",
        "clients/bad.py:2 imports gleanrl.trainer.loop",
    ]


def test_every_package_folder_is_installed():
    """pyproject lists the packages (package-dir maps the top-level folders into gleanrl): a new subfolder
    that is not listed would be missing from a non-editable install."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {name: Path(folder) for name, folder in setup["package-dir"].items()}
    wanted = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            wanted.add(".".join([name, *rel.parts]))
    assert wanted == set(setup["packages"])
