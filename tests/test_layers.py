"""The layers of the house (docs/layout.md): each imports only those below it, no two modules import each other
in a circle, nothing imports a command-line entry point, and reports load without torch."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from bench.artifacts import PROJECT_ROOT

# Lowest first; a module may import its own layer's modules and those of lower layers. methods and planning are
# side by side (rank 3): neither imports the other.
LAYERS = [
    (0, ("bench", "bench.errors", "bench.artifacts", "bench.records", "tasks", "tasks.prompts")),
    (1, ("bench.models", "bench.corpora", "bench.validate", "bench.config")),
    (2, ("bench.engine",)),
    (3, ("bench.planning",)),
    (3, ("methods",)),
    (4, ("bench.measure",)),
    (5, ("bench.report",)),
]
SIDE_BY_SIDE = {"bench.planning", "methods"}
ENTRY_POINTS = {"bench.__main__", "bench.smoke", "bench.train", "bench.profile", "bench.datastore", "bench.regress",
                "bench.report.__main__"}
SOURCE_FOLDERS = ("bench", "methods", "tasks")


def module_name(path) -> str:
    parts = list(path.relative_to(PROJECT_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports() -> dict[str, set[str]]:
    """module -> the project modules it imports, at module level or inside functions."""
    sources = {module_name(p): p for folder in SOURCE_FOLDERS for p in (PROJECT_ROOT / folder).rglob("*.py")}
    graph = {}
    for name, path in sources.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                candidates = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            imported |= {c for c in candidates if c in sources and c != name}
        graph[name] = imported
    return graph


def layer_of(module: str) -> tuple[int, str] | None:
    """(rank, layer prefix) of the longest prefix that names the module's layer; None for entry points."""
    if module in ENTRY_POINTS:
        return None
    best = None
    for rank, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (rank, prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def test_every_import_goes_down_or_stays_in_its_layer():
    upward = []
    for module, imported in project_imports().items():
        mine = layer_of(module)
        for other in imported:
            theirs = layer_of(other)
            if mine is None:  # entry points may import anything but each other
                continue
            if theirs is None or theirs[0] > mine[0] or {mine[1], theirs[1]} == SIDE_BY_SIDE:
                upward.append(f"{module} -> {other}")
    assert upward == []


def test_no_module_imports_an_entry_point():
    graph = project_imports()
    assert [f"{m} -> {o}" for m, imported in graph.items() for o in imported if o in ENTRY_POINTS] == []


def test_no_import_circles():
    graph, state, circles = project_imports(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                circles.append(" -> ".join(path[path.index(other):] + [other]))
            elif other not in state:
                visit(other, path + [other])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_engine_needs_nothing_above_it():
    for module, imported in project_imports().items():
        if module.startswith("bench.engine"):
            assert {o for o in imported if not o.startswith("bench.engine")} <= {"bench.records"}, module


@pytest.mark.parametrize("module", ["bench.report.render", "bench.report.regress", "bench.report.runs",
                                    "bench.report.tables", "bench.report.plots"])
def test_reports_import_without_torch(module):
    code = f"import sys; sys.modules['torch'] = None; import {module}"
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]


def test_no_function_in_bench_is_over_60_lines():
    long = []
    for path in (PROJECT_ROOT / "bench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno} {node.name}")
    assert long == []
