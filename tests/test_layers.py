"""The layers of the house (docs/layout.md): each imports only those below it, no two modules import each other
in a circle, nothing imports a command-line entry point or a study, the parity checks' reference-code drivers import
nothing of the project, reports load without torch, and every folder of Python source has a rule here."""
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
    (6, ("bench.parity",)),  # beside the reference code: the engine, the methods, the measurement's divergence finding
]
SIDE_BY_SIDE = {"bench.planning", "methods"}
ENTRY_POINTS = {"bench.__main__", "bench.smoke", "bench.train", "bench.profile", "bench.datastore", "bench.regress",
                "bench.migrate_answers", "bench.convert", "bench.report.__main__", "bench.parity.__main__",
                "bench.parity.engines", "tasks.build_long_inputs"}
# Folders of modules that may import anything and that nothing imports: one-off studies feeding a doc, and Hydra's
# plugins (Hydra finds them by their namespace)
TOP_FOLDERS = ("studies", "hydra_plugins")
SOURCE_FOLDERS = ("bench", "methods", "tasks", *TOP_FOLDERS)
SIDES = "bench.parity.sides"  # run by path in side environments: import nothing of the project
PROJECT_PACKAGES = {"bench", "methods", "tasks", "tests", *TOP_FOLDERS}


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


def is_top(module: str) -> bool:
    """An entry point, a study or a plugin: it may import anything, and nothing imports it."""
    return module in ENTRY_POINTS or module.split(".")[0] in TOP_FOLDERS


def layer_of(module: str) -> tuple[int, str] | None:
    """(rank, layer prefix) of the longest prefix that names the module's layer; None for entry points, studies and
    plugins."""
    if is_top(module):
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


def test_no_module_imports_an_entry_point_or_a_study():
    graph = project_imports()
    assert [f"{m} -> {o}" for m, imported in graph.items() for o in imported if is_top(o)] == []


def imported_roots(path) -> set[str]:
    """The top-level names of every module a file imports (at module level or inside functions)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
    return roots


def test_the_reference_code_drivers_import_nothing_of_the_project():
    """bench/parity/sides/ runs in side environments with other packages pinned: its drivers import only what is
    installed there and each other, never the project (whose package __init__ alone would load it)."""
    folder = PROJECT_ROOT / SIDES.replace(".", "/")
    drivers = {path.stem for path in folder.glob("*.py")}
    found = {path.name: sorted(imported_roots(path) & PROJECT_PACKAGES) for path in folder.glob("*.py")}
    assert {name: roots for name, roots in found.items() if roots} == {}
    assert "upstream_driver" in imported_roots(folder / "spec_bench_driver.py") & drivers  # siblings, by name


def test_the_drivers_run_by_path_without_the_project():
    """Each driver imports as its side environment imports it (`python bench/parity/sides/<driver>.py`), and no
    module of the project is loaded then."""
    folder = PROJECT_ROOT / SIDES.replace(".", "/")
    drivers = sorted(path.stem for path in folder.glob("*_driver.py"))
    code = (f"import sys; sys.path[0] = {str(folder)!r}\n" + "".join(f"import {d}\n" for d in drivers) +
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(PROJECT_PACKAGES)!r})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
    assert done.stdout.strip() == "[]"


def test_every_folder_of_python_source_has_a_rule():
    """Python outside the layered folders (and tests) would have no rule: tools/ holds shell scripts only."""
    folders = {path.relative_to(PROJECT_ROOT).parts[0] for path in PROJECT_ROOT.rglob("*.py")
               if not any(part.startswith(".") for part in path.relative_to(PROJECT_ROOT).parts)}
    assert folders <= {*SOURCE_FOLDERS, "tests"}


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
                                    "bench.report.tables", "bench.report.plots", "bench.report.reference",
                                    "bench.report.docs_blocks"])
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
