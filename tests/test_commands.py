"""Every command has one home: its main() lives in its command module (`python -m bench.<name>`), library modules
have none, every console script of pyproject.toml names one of them (nine at most), docs/running.md lists them all,
each study (studies/) is in studies/README.md, and each answers --help with its usage."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import tomllib

from bench.artifacts import PROJECT_ROOT

# module -> how it is run; Hydra for commands over the run config, argparse for reports over folders and the smoke
COMMANDS = {
    "bench.__main__": "python -m bench",
    "bench.train": "python -m bench.train",
    "bench.datastore": "python -m bench.datastore",
    "bench.profile": "python -m bench.profile",
    "bench.smoke": "python -m bench.smoke",
    "bench.regress": "python -m bench.regress",
    "bench.migrate_answers": "python -m bench.migrate_answers",
    "bench.convert": "python -m bench.convert",
    "bench.report.__main__": "python -m bench.report",
    "bench.parity.__main__": "python -m bench.parity",
    "bench.parity.engines": "python -m bench.parity.engines",
    "tasks.build_long_inputs": "python -m tasks.build_long_inputs",
}
SOURCE_FOLDERS = ("bench", "methods", "tasks")
DRIVERS = "bench.parity.sides."  # the parity checks' reference-code drivers: run by path in side environments


def module_name(path) -> str:
    parts = list(path.relative_to(PROJECT_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(folders: tuple[str, ...] = SOURCE_FOLDERS) -> dict[str, ast.Module]:
    found = {module_name(p): ast.parse(p.read_text()) for folder in folders
             for p in (PROJECT_ROOT / folder).rglob("*.py")}
    return {name: tree for name, tree in found.items() if not name.startswith(DRIVERS)}


def studies() -> list[str]:
    """The studies: the modules of studies/ that run as scripts."""
    return sorted(name for name, tree in modules(("studies",)).items() if runs_as_script(tree))


def runs_as_script(tree: ast.Module) -> bool:
    """Whether the module has an `if __name__ == "__main__":` block."""
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def test_every_main_and_every_script_block_is_in_a_command_module():
    mains = {name for name, tree in modules().items()
             if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)}
    scripts = {name for name, tree in modules().items() if runs_as_script(tree)}
    assert mains == set(COMMANDS) and scripts <= set(COMMANDS)


def console_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts]: {script name: "module:function"}."""
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_each_console_script_is_a_command_main_that_imports():
    targets = {name: target.split(":") for name, target in console_scripts().items()}
    assert {module for module, _ in targets.values()} <= set(COMMANDS) and len(targets) <= 9
    for name, (module, function) in targets.items():
        assert function == "main" and callable(getattr(importlib.import_module(module), function)), name


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_each_command_runs_as_a_script_and_docs_running_lists_it(module):
    path = PROJECT_ROOT / (module.replace(".", "/") + ".py")
    assert runs_as_script(ast.parse(path.read_text()))
    assert f"`{COMMANDS[module]}" in (PROJECT_ROOT / "docs" / "running.md").read_text()


def test_each_study_is_listed_in_the_studies_readme_with_its_command():
    readme = (PROJECT_ROOT / "studies" / "README.md").read_text()
    assert studies() and [s for s in studies() if f"`python -m {s}" not in readme] == []


def test_the_datastore_command_builds_rest_or_samd_and_refuses_other_methods(monkeypatch, capsys):
    from hydra import compose, initialize_config_dir

    import bench.datastore
    import methods.rest_datastore
    import methods.suffix_automaton

    built = []
    monkeypatch.setattr(methods.rest_datastore, "build", lambda cfg: built.append(("rest", cfg.datastore.path)))
    monkeypatch.setattr(methods.suffix_automaton, "build",
                        lambda cfg: built.append(("samd", cfg.method.drafter.corpus.max_conversations)))
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        configs = [compose("build_datastore", overrides=overrides) for overrides in (
            ["datastore.path=/tmp/x.idx"], ["method=samd", "method.drafter.corpus.max_conversations=300"],
            ["method=eagle"])]
    bench.datastore.build(configs[0])
    bench.datastore.build(configs[1])
    assert built == [("rest", "/tmp/x.idx"), ("samd", 300)]
    with pytest.raises(SystemExit) as refused:
        bench.datastore.build(configs[2])
    assert refused.value.code == 2 and capsys.readouterr().err == \
        "error: method=eagle: has no corpus index to build; methods with one: rest, samd\n"


def help_commands() -> dict[str, list[str]]:
    """{what a user types: argv answering --help}: each `python -m` module with a script block (its package for a
    __main__), and each console script of pyproject.toml, run as its installed wrapper runs it (main() with the
    script's name as argv[0]) on this checkout's code."""
    runnable = sorted(name.removesuffix(".__main__") for name, tree in modules().items() if runs_as_script(tree))
    commands = {f"python -m {module}": [sys.executable, "-m", module, "--help"] for module in runnable + studies()}
    for name, target in console_scripts().items():
        module, function = target.split(":")
        wrapper = f"import sys; from {module} import {function}; sys.argv[0] = {name!r}; sys.exit({function}())"
        commands[name] = [sys.executable, "-c", wrapper, "--help"]
    return commands


@pytest.fixture(scope="module")
def help_outputs() -> dict[str, subprocess.CompletedProcess]:
    """Every help_commands() command run once, two at a time (each imports torch)."""
    def answer(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)

    commands = help_commands()
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(commands, pool.map(answer, commands.values())))


def test_every_command_and_console_script_answers_help_with_its_usage(help_outputs):
    # each command and study as `python -m`, and each console script
    assert len(help_outputs) == len(COMMANDS) + len(studies()) + len(console_scripts())
    modules_of = {name: target.split(":")[0].removesuffix(".__main__") for name, target in console_scripts().items()}
    for command, done in help_outputs.items():
        module = modules_of.get(command, command.removeprefix("python -m "))
        assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
        assert done.stdout.startswith(f"usage: python -m {module} "), command


def test_the_benchmark_help_is_a_page_of_usage_not_the_config(help_outputs):
    text = help_outputs["python -m bench"].stdout
    assert len(text.splitlines()) < 30 and "out_dir: results/runs" not in text  # Hydra's dump: --cfg job
    for line in ("python -m bench -m method=pld,suffix,eagle2", "python -m bench.report results/runs --out report",
                 "task.limit=N", "gen.max_new_tokens=N", "gen.temperature=T", "method.drafter.<knob>=V", "out_dir=PATH",
                 "docs/running.md", "--cfg job", "--info"):
        assert line in text, line
    groups = dict(line.split(None, 1) for line in text.split("Config groups")[1].split("\n\n")[0].splitlines()[1:])
    assert groups["method"] == ", ".join(sorted(p.stem for p in (PROJECT_ROOT / "conf" / "method").glob("*.yaml")))
    assert set(groups) == {"method", "task", "model", "server"}
