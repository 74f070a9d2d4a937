"""The one-way import rule of DESIGN.md (Layout), checked on the source with the AST, lazy imports
(inside functions) included: top layer -> anything; trainer -> clients, harvest; server -> the
harvest modules that define the drafter and its checkpoint format; harvest and clients -> nothing of
the project; every component -> base; base -> nothing of the project."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("server", "harvest", "trainer", "clients", "base")
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "clients": {"base"},
    "harvest": {"base"},
    "server": {"base", "harvest.drafter", "harvest.drafter_config", "harvest.checkpoint"},
    "trainer": {"base", "clients", "harvest"},
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
    (tmp_path / "server" / "ok.py").write_text(
        "from gleanrl.harvest.drafter import Eagle3Drafter\n"
        "from gleanrl.server.model.kv import "
        "SeqKVCache\nimport torch\n"
    )
    (tmp_path / "clients" / "bad.py").write_text("def f():\n    from gleanrl.trainer.loop import train\n")
    (tmp_path / "harvest" / "bad.py").write_text("import gleanrl.clients.rollout_client\n")
    (tmp_path / "base" / "bad.py").write_text("from gleanrl.harvest import spool\n")
    (tmp_path / "server" / "bad.py").write_text(
        "from gleanrl.harvest.harvester import Harvester\nfrom gleanrl import bench\nimport trainer.tasks\n"
    )
    found = violations(tmp_path)
    assert found == [
        "server/bad.py:1 imports gleanrl.harvest.harvester",
        "server/bad.py:2 imports gleanrl.bench",
        "server/bad.py:3 imports trainer.tasks (a top-level name: import it as gleanrl.trainer.tasks)",
        "harvest/bad.py:1 imports gleanrl.clients.rollout_client",
        "clients/bad.py:2 imports gleanrl.trainer.loop",
        "base/bad.py:1 imports gleanrl.harvest",
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


# Inside the server: packages (and top-level modules) in layer order, lowest first. An import from one
# to another must go down; inside one, the module graph must have no cycle (docs/structure.md).
SERVER_LAYERS = (
    "protocol",
    "config",
    "model",
    "weights",
    "sampling",
    "sd",
    "decode",
    "engine",
    "http",
    "proxy",
    "sglang",
    "cli",
)
# Inside `http/` likewise: what every request passes (edge/) < the generation core and /generate
# < the OpenAI routes < SGLang's other native routes < the app's own modules.
HTTP_LAYERS = ("edge", "generate", "openai", "native", "metrics", "config", "app")
LAYERS = {"server": SERVER_LAYERS, "server.http": HTTP_LAYERS}
# The engine's package is its door (`Engine`, `PAUSE_MODES`); its other modules are its parts.
ENGINE = "server.engine"
OUTSIDE_ENGINE = ("server", "gleanrl", "examples", "scripts", "tests")


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[list[str]]:
    """Per name an import statement binds, the dotted names it may be, most specific first, by
    folder (`gleanrl.server.engine` is `server.engine`): `from pkg import x` is `pkg.x` if that is a
    module, else `pkg`."""
    if isinstance(node, ast.Import):
        return [[alias.name] for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".")[: len(module.split(".")) - node.level + is_package]
        base = ".".join(package + ([base] if base else []))
    return [[f"{base}.{alias.name}", base] for alias in node.names]


def _by_folder(name: str) -> str:
    head, _, rest = name.partition(".")
    return rest if head == "gleanrl" and rest.split(".")[0] in COMPONENTS else name


def import_graph(root: Path, folders: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of `root` it imports (lazy and TYPE_CHECKING imports included); a name
    that is not a module resolves to the longest module prefix (`from pkg import Name` -> pkg)."""
    files = {_module_name(root, p): p for f in folders for p in sorted((root / f).rglob("*.py"))}
    graph = {}
    for mod, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for names in _imported(node, mod, path.name == "__init__.py"):
                names = [_by_folder(n) for n in names]
                name = next((n for n in names if n in files), names[-1])
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    targets.add(name)
        graph[mod] = targets
    return graph


def _layer(mod: str, package: str = "server") -> str | None:
    """The package or module right below `package` that `mod` is in (None: not below it)."""
    return mod[len(package) + 1 :].split(".")[0] if mod.startswith(package + ".") else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in sorted(graph.items()):
        for t in sorted(targets):
            for package, order in LAYERS.items():
                rank = {name: i for i, name in enumerate(order)}
                a, b = _layer(mod, package), _layer(t, package)
                if a and b and a != b and not (a in rank and b in rank and rank[b] < rank[a]):
                    bad.append(f"{mod} imports {t} ({a} -> {b} runs up the layers)")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected part that has one (depth-first, colours)."""
    found, colour, stack = [], {}, []

    def visit(mod: str) -> None:
        colour[mod] = "grey"
        stack.append(mod)
        for t in sorted(graph.get(mod, ())):
            if colour.get(t) == "grey":
                found.append(stack[stack.index(t) :] + [t])
            elif t not in colour:
                visit(t)
        stack.pop()
        colour[mod] = "black"

    for mod in sorted(graph):
        if mod not in colour:
            visit(mod)
    return found


def engine_part_imports(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside server/engine/ that import one of its modules but the package (the test
    files themselves aside: they may test a part alone; their helpers may not)."""
    return [
        f"{mod} imports {t}"
        for mod, targets in sorted(graph.items())
        if not (mod == ENGINE or mod.startswith(ENGINE + ".")) and not mod.rpartition(".")[2].startswith("test_")
        for t in sorted(targets)
        if t.startswith(ENGINE + ".")
    ]


def test_server_layers_import_down_and_without_cycles():
    graph = import_graph(ROOT, ("server",))
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the graph was read
    assert layer_violations(graph) == []
    assert cycles(graph) == []
    for package, order in LAYERS.items():  # every package has a place
        assert {_layer(m, package) for m in graph} - {None} == set(order)


def test_no_import_cycle_anywhere():
    """Lazy imports inside functions count: a circle is a circle even when Python tolerates it
    (bench load <-> bench hostile was one)."""
    graph = import_graph(ROOT, ("gleanrl", *COMPONENTS))
    assert len(graph) > 100 and cycles(graph) == []  # the graph was read


def test_nothing_outside_the_engine_imports_its_parts():
    assert engine_part_imports(import_graph(ROOT, OUTSIDE_ENGINE)) == []


def test_layer_checks_catch_planted_imports(tmp_path):
    files = {
        "server/__init__.py": "",
        "server/engine/__init__.py": "from gleanrl.server.engine.engine import Engine\n",
        "server/engine/engine.py": "from gleanrl.server.engine.state import EngineState\n",
        "server/engine/scheduler.py": "",
        "server/engine/state.py": "from gleanrl.server.sampling.sequence import Sequence\n",
        "server/sampling/__init__.py": "",
        "server/sampling/sequence.py": "def f():\n    from gleanrl.server.engine import state\n",
        "server/model/__init__.py": "",
        "server/model/a.py": "from . import b\n",
        "server/model/b.py": "import gleanrl.server.model.a\n",
        "server/http/app.py": "from gleanrl.server.engine import Engine\n",
        "server/http/native/control.py": "from gleanrl.server.engine.state import EngineState\n",
        "server/http/edge/limits.py": "from gleanrl.server.http.generate.fanin import Track\n",
        "server/http/generate/fanin.py": "from gleanrl.server.http.edge import limits\n",
        "server/http/generate/params.py": "def f():\n    from gleanrl.server.http.openai.tools import plan_tools\n",
        "server/http/openai/chat.py": "from gleanrl.server.http.state import AppState\n",
        "server/http/openai/tools.py": "",
        "server/http/state.py": "",
        "gleanrl/bench.py": "from gleanrl.server.engine import scheduler\n",
        "tests/helper.py": "from gleanrl.server.engine.engine import Engine\n",
        "tests/test_x.py": "from gleanrl.server.engine.state import EngineState\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("server",))
    assert layer_violations(graph) == [
        "server.http.edge.limits imports server.http.generate.fanin (edge -> generate runs up the layers)",
        "server.http.generate.params imports server.http.openai.tools (generate -> openai runs up the layers)",
        "server.http.openai.chat imports server.http.state (openai -> state runs up the layers)",
        "server.sampling.sequence imports server.engine.state (sampling -> engine runs up the layers)",
    ]
    assert sorted(map(tuple, cycles(graph))) == [
        ("server.engine.state", "server.sampling.sequence", "server.engine.state"),
        ("server.http.edge.limits", "server.http.generate.fanin", "server.http.edge.limits"),
        ("server.model.a", "server.model.b", "server.model.a"),
    ]
    assert engine_part_imports(import_graph(tmp_path, ("server", "gleanrl", "tests"))) == [
        "gleanrl.bench imports server.engine.scheduler",
        "server.http.native.control imports server.engine.state",
        "server.sampling.sequence imports server.engine.state",
        "tests.helper imports server.engine.engine",
    ]
