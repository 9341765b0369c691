"""The shape of the code: layers import downwards, stages stand alone, plugins use one door.

Read from the source with ``ast`` (nothing is imported): every ``import`` of a
umahub module, at module level or inside a function, is an edge; imports
under ``if TYPE_CHECKING:`` are not (they are never executed).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import umahub

ROOT = Path(umahub.__file__).parent
LONG_REASON = "Why this module is long:"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = ["umahub", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _runtime_imports(path: Path, name: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    type_checking = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_checking |= {id(n) for b in node.body for n in ast.walk(b)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            names = [f"{base}.{a.name}" for a in node.names]
            # ``from package import module`` depends on the module, not on all of the package.
            targets = [n for n in names if n in known] or [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("umahub"):
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _runtime_imports(path, name, known) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, or None. Package ``__init__`` re-exports (the public API) are left out:
    they are the top of the graph, not a layer anyone builds on."""
    edges = {m: {t for t in ts if t != "umahub"} for m, ts in graph.items() if m != "umahub"}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles_among_umahub_modules():
    assert _cycle(_graph()) is None


def test_a_stage_imports_no_other_stage_nor_the_hub_nor_the_pipeline():
    graph = _graph()
    stages = {m for m in graph if m.startswith("umahub.compiler.stages.")}
    assert stages == {
        f"umahub.compiler.stages.{s}"
        for s in ("plan", "partition", "memory", "lower", "build", "verify")
    }
    forbidden = stages | {
        "umahub.hub",
        "umahub.hub.hub",
        "umahub.compiler.pipeline",
        "umahub.compiler.stages",
        "umahub",
    }
    offending = {m: sorted(graph[m] & (forbidden - {m})) for m in stages}
    assert offending == {m: [] for m in stages}


#: The foundation: what every layer may import. It imports nothing else of umahub.
FOUNDATION = {
    "umahub._moved",
    "umahub._tvm",
    "umahub.config",
    "umahub.config_files",
    "umahub.errors",
    "umahub.ir",
    "umahub.lanes",
    "umahub.qparams",
    "umahub.sizes",
    "umahub.targets",
}

#: Each layer (a subpackage, or one module of one) and the layers it may import besides
#: itself and the foundation. The facades above them (``umahub``, ``umahub.hub.hub``, the
#: plugin API's door ``umahub.plugin``, ``umahub.cli``) are not layers anyone builds on.
LAYERS = {
    "umahub.plugin": set(),
    "umahub.runtime": {"umahub.plugin"},
    "umahub.boards": {"umahub.runtime"},
    "umahub.hub": {"umahub.plugin"},
    # the host's schedule and the lower stage ask the tuning database first
    # (umahub.tuning.lookup), which reads the database and nothing else of umahub's tuning
    "umahub.tuning.database": set(),
    "umahub.tuning.lookup": {"umahub.tuning.database", "umahub.plugin"},
    "umahub.host": {"umahub.plugin", "umahub.hub.tracing", "umahub.tuning.lookup"},
    "umahub.report": {"umahub.plugin", "umahub.hub.tracing"},
}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _layer_breaches(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    facades = {"umahub", "umahub.plugin", "umahub.hub", "umahub.hub.hub"}
    breaches: dict[str, list[str]] = {}
    for module, imports in graph.items():
        if module in facades:
            continue
        if module in FOUNDATION:
            allowed = FOUNDATION
        else:
            layer = next((p for p in sorted(LAYERS, key=len, reverse=True) if _in(module, p)), None)
            if layer is None:
                continue
            allowed = FOUNDATION | {layer} | LAYERS[layer]
        bad = sorted(t for t in imports if not any(_in(t, a) for a in allowed) and t != module)
        if bad:
            breaches[module] = bad
    return breaches


def test_each_layer_imports_only_the_layers_below_it():
    assert _layer_breaches(_graph()) == {}


def test_the_layer_check_finds_a_breach():
    graph = {"umahub.runtime.running": {"umahub.compiler.pipeline", "umahub.errors"}}
    assert _layer_breaches(graph) == {"umahub.runtime.running": ["umahub.compiler.pipeline"]}


def test_the_report_data_imports_none_of_its_views():
    graph = _graph()
    views = {m for m in graph if _in(m, "umahub.report.picture")} | {"umahub.report.text"}
    assert {m: sorted(graph[m] & views) for m in ("umahub.report.data", "umahub.report.text")} == {
        "umahub.report.data": [],
        "umahub.report.text": [],
    }


PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def _plugin_sources() -> list[Path]:
    return sorted(PLUGINS.glob("*/src/**/*.py"))


def test_the_bundled_plugins_import_only_the_plugin_api():
    """A plugin's door into umahub is ``umahub.plugin``; everything else is internal."""
    assert _plugin_sources(), f"no plugin sources under {PLUGINS}"
    reached = {}
    for path in _plugin_sources():
        name = ".".join(path.relative_to(path.parents[1]).with_suffix("").parts)
        imports = _runtime_imports(path, name, set(_modules()))
        names = {i for i in imports if i != "umahub" or _imports_umahub_itself(path)}
        outside = sorted(i for i in names if not _in(i, "umahub.plugin"))
        if outside:
            reached[str(path.relative_to(PLUGINS))] = outside
    assert reached == {}


def _imports_umahub_itself(path: Path) -> bool:
    """``import umahub`` (the user's API), which ``_runtime_imports`` reports as "umahub"."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name == "umahub" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "umahub" and not node.level:
            return True
    return False


@pytest.mark.parametrize("name", sorted(_modules()))
def test_a_long_module_says_why(name):
    path = _modules()[name]
    lines = len(path.read_text().splitlines())
    if lines > MAX_LINES:
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert LONG_REASON in docstring, f"{name}: {lines} lines and no '{LONG_REASON}'"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
