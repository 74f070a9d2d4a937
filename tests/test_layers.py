"""The one-way import rule of DESIGN.md (Layout), checked on the source with the AST, lazy imports
(inside functions) included: top layer -> anything; trainer -> clients, harvest; server -> the
harvest modules that define the drafter and its checkpoint format; harvest and clients -> nothing of
the project but records, the ground every component may import; records -> nothing."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("server", "harvest", "trainer", "clients", "records")
ALLOWED: dict[str, set[str]] = {
    "clients": {"records"},
    "harvest": {"records"},
    "server": {"harvest.drafter", "harvest.drafter_config", "harvest.checkpoint", "harvest.atomic",
               "records"},
    "trainer": {"clients", "harvest", "records"},
    "records": set(),
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
                                               "from gleanrl.server.model.kv import "
                                               "SeqKVCache\nimport torch\n")
    (tmp_path / "clients"
     / "bad.py").write_text("def f():\n    from gleanrl.trainer.loop import train\n")
    (tmp_path / "harvest" / "bad.py").write_text("import gleanrl.clients.rollout_client\n")
    (tmp_path / "harvest" / "ok.py").write_text("from gleanrl.records import FinishedRollout\n")
    (tmp_path / "records" / "bad.py").write_text("from gleanrl.harvest.hooks import HarvestHooks\n")
    (tmp_path / "server" / "bad.py").write_text("from gleanrl.harvest.harvester import Harvester\n"
                                                "from gleanrl import bench\nimport trainer.tasks\n")
    found = violations(tmp_path)
    assert found == [
        "server/bad.py:1 imports gleanrl.harvest.harvester",
        "server/bad.py:2 imports gleanrl.bench",
        "server/bad.py:3 imports trainer.tasks (a top-level name: import it as gleanrl.trainer.tasks)",
        "harvest/bad.py:1 imports gleanrl.clients.rollout_client",
        "clients/bad.py:2 imports gleanrl.trainer.loop",
        "records/bad.py:1 imports gleanrl.harvest.hooks",
    ]


def test_every_package_folder_is_installed():
    """pyproject lists the packages (package-dir maps the top-level folders into gleanrl): a new
    subfolder that is not listed would be missing from a non-editable install."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {name: Path(folder) for name, folder in setup["package-dir"].items()}
    wanted = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            wanted.add(".".join([name, *rel.parts]))
    assert wanted == set(setup["packages"])


# The engine's parts: only the engine's own modules touch them; everything else uses
# Engine's methods.
ENGINE_PARTS = {"scheduler", "swapper", "decoder", "loop", "state"}
ENGINE_PACKAGE = ("server/engine/",)
CHECKED = (*COMPONENTS, "gleanrl", "examples")


def _names_an_engine(node: ast.expr) -> bool:
    """`engine`, `eng`, `self.engine`, `state.engine`, `request.app.state.engine`..."""
    if isinstance(node, ast.Name):
        return node.id in ("engine", "eng") or node.id.endswith("_engine")
    return isinstance(node, ast.Attribute) and (
        node.attr == "engine" or node.attr.endswith("_engine"))


def side_doors(root: Path) -> list[str]:
    bad = []
    for folder in CHECKED:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if any(rel.startswith(p) for p in ENGINE_PACKAGE):
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                attr = getattr(node, "attr", "")
                private = isinstance(node, ast.Attribute) and (
                    attr in ENGINE_PARTS or attr.startswith("_") and not attr.startswith("__"))
                if private and _names_an_engine(node.value):
                    bad.append(f"{rel}:{node.lineno} touches the engine's .{node.attr}")
    return bad


def test_nothing_outside_the_engine_touches_its_parts():
    assert side_doors(ROOT) == []


def test_side_door_checker_catches_them(tmp_path):
    (tmp_path / "server").mkdir()
    (tmp_path / "gleanrl").mkdir()
    (tmp_path / "server" / "ok.py").write_text("engine.update_weights(p)\nx = engine.cfg.device\n"
                                               "app.state.engine.info()\n")
    (tmp_path / "server" / "bad.py").write_text("engine.scheduler.pool = None\n"
                                                "r = request.app.state.engine.swapper.signature\n")
    (tmp_path / "gleanrl" / "bad.py").write_text(
        "n = plain_engine.decoder.verify_ct + eng._rng.seed()\n")
    assert side_doors(tmp_path) == [
        "server/bad.py:1 touches the engine's .scheduler",
        "server/bad.py:2 touches the engine's .swapper",
        "gleanrl/bad.py:1 touches the engine's .decoder",
        "gleanrl/bad.py:1 touches the engine's ._rng",
    ]
