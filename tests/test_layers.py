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
    (0, ("bench", "bench.blas", "bench.errors", "bench.artifacts", "bench.records", "tasks", "tasks.prompts")),
    (1, ("bench.models", "bench.corpora", "bench.validate", "bench.config")),
    (2, ("bench.engine",)),
    (3, ("bench.planning",)),
    (3, ("methods",)),
    (4, ("bench.measure",)),
    (5, ("bench.report",)),
]
SIDE_BY_SIDE = {"bench.planning", "methods"}
ENTRY_POINTS = {"bench.__main__", "bench.smoke", "bench.train", "bench.profile", "bench.datastore", "bench.regress",
                "bench.migrate_answers", "bench.report.__main__", "tasks.build_long_inputs"}
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


PROTOCOL = "bench/measure/protocol.py"  # the one module that writes a run's files and alternates its sides
RUN_FILES = {"answers.jsonl", "baseline.jsonl", "skipped.jsonl", "summary.csv", "meta.json"}
WRITERS = {"write_text", "write_bytes", "to_csv", "to_json", "AnswerFile"}  # calls that write to a path they name


def protocol_work(tree: ast.AST) -> list[str]:
    """What only the protocol may do, found in a module's syntax tree: calls that write to a path naming a run file
    (or build an AnswerFile), and `x % 2` (alternating which side goes first)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and getattr(node.right, "value", None) == 2:
            found.append((node.lineno, "% 2"))
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        named = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)} & RUN_FILES
        if name == "AnswerFile" or (name in WRITERS and named):
            found.append((node.lineno, f"{name}({', '.join(sorted(named))})"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_only_the_protocol_writes_run_files_or_alternates_sides():
    others = {}
    for path in sorted((PROJECT_ROOT / "bench").rglob("*.py")):
        found = protocol_work(ast.parse(path.read_text()))
        if found and str(path.relative_to(PROJECT_ROOT)) != PROTOCOL:
            others[str(path.relative_to(PROJECT_ROOT))] = found
    assert others == {}
    assert protocol_work(ast.parse((PROJECT_ROOT / PROTOCOL).read_text())) != []  # the rule sees the protocol's


def test_the_protocol_rule_sees_a_second_writer():
    second = ast.parse("def finish(out, rows, meta, number):\n"
                       "    rows.to_csv(out / 'summary.csv')\n"
                       "    (out / 'meta.json').write_text(meta)\n"
                       "    answers = AnswerFile(out / 'other.jsonl', 'key', strict=True)\n"
                       "    first = number % 2 == 0\n"
                       "    (out / 'leaderboard.csv').write_text(meta)\n")
    assert protocol_work(second) == ["line 2: to_csv(summary.csv)", "line 3: write_text(meta.json)",
                                     "line 4: AnswerFile()", "line 5: % 2"]
