"""docs/layout.md's "adding a method" is true: a throwaway method added as it says (one folder methods/<name>/ with a
drafter, one YAML conf/method/<name>.yaml, one parity file bench/parity/methods/<name>.py), in a copy of the project
and with no other file touched, is in the smoke list, is one of the sampling test's cases, is on `python -m
bench.parity --list`, runs lossless on SmolLM2 and is in the report's leaderboard."""
from __future__ import annotations

import csv
import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.artifacts import PROJECT_ROOT
from bench.smoke import available_methods
from tests.test_sampling_methods import method_cases

NAME = "throwaway"
COPIED = ("bench", "methods", "tasks", "conf")  # what `python -m bench` and `python -m bench.report` read
DRAFTER = '''"""A throwaway method: the last token again."""
from bench.engine.drafter import Drafter
from bench.engine.tree import DraftTree


class RepeatDrafter(Drafter):
    """Proposes a chain of `length` copies of the context's last token."""

    def __init__(self, target=None, tokenizer=None, length: int = 2):
        self.length = length

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        count = min(self.length, max_tokens - 1)
        return DraftTree.chain([context[-1]] * count) if count > 0 else None

    def update(self, step) -> None:
        pass
'''
CONFIG = f'''# A throwaway method (tests/test_new_method.py): the last token again.
defaults:
  - shared/speculation@_here_  # sizing
  - _self_
name: {NAME}
drafter:
  _target_: methods.{NAME}.drafter.RepeatDrafter
  length: 2
'''
PARITY = f'''"""{NAME} beside itself: a throwaway parity file (tests/test_new_method.py)."""
from bench.parity.protocol import Comparison, counted_outputs, engine_outputs

AGAINST = "its own drafter"


def comparisons(setup, work):
    ours = counted_outputs(setup, engine_outputs(setup, setup.drafter("{NAME}")))
    return [Comparison("{NAME}", "length=2, both sides ours", ours, ours)]
'''
ADDED = {f"methods/{NAME}/__init__.py": "", f"methods/{NAME}/drafter.py": DRAFTER, f"conf/method/{NAME}.yaml": CONFIG,
         f"bench/parity/methods/{NAME}.py": PARITY}


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the project's code and configs with the throwaway method added, and nothing else changed."""
    root = tmp_path / "project"
    for folder in COPIED:
        shutil.copytree(PROJECT_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in ADDED.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def changed_files(root: Path) -> set[str]:
    """Paths (relative, without __pycache__) under the copied folders that differ from the project's or are new."""
    changed = set()
    for folder in COPIED:
        for path in (root / folder).rglob("*"):
            relative = path.relative_to(root)
            if path.is_file() and "__pycache__" not in relative.parts:
                original = PROJECT_ROOT / relative
                if not original.is_file() or not filecmp.cmp(path, original, shallow=False):
                    changed.add(relative.as_posix())
    return changed


def test_a_new_method_is_one_folder_and_one_yaml(project):
    assert changed_files(project) == set(ADDED)
    assert NAME in available_methods(project / "conf")
    assert [(case, knobs) for case, method, knobs in method_cases(project / "conf") if method == NAME] == [
        (NAME, {"_target_": f"methods.{NAME}.drafter.RepeatDrafter", "length": 2})]
    assert NAME not in available_methods()  # the real tree is untouched
    assert NAME not in {method for _, method, _ in method_cases(PROJECT_ROOT / "conf")}


def test_a_new_method_has_a_parity_file_on_the_parity_list(project):
    listed = subprocess.run([sys.executable, "-m", "bench.parity", "--list"], cwd=project, check=True,
                            capture_output=True, text=True).stdout.splitlines()
    assert f"{NAME:16s} against its own drafter" in listed
    assert NAME not in subprocess.run([sys.executable, "-m", "bench.parity", "--list"], cwd=PROJECT_ROOT, check=True,
                                      capture_output=True, text=True).stdout  # the real tree is untouched
    assert changed_files(project) == set(ADDED)


@pytest.mark.real_model
def test_a_new_method_runs_and_is_on_the_leaderboard(project, tmp_path):
    runs = tmp_path / "runs"
    subprocess.run([sys.executable, "-m", "bench", f"method={NAME}", "model=smollm2_135m", "task=mt_bench",
                    "task.limit=2", "gen.max_new_tokens=16", f"out_dir={runs / NAME}"], cwd=project, check=True,
                   capture_output=True, text=True)
    answers = [json.loads(line) for line in (runs / NAME / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 2 and {a["method"] for a in answers} == {NAME}
    assert all(a["exact_match"] is True for a in answers)  # the same tokens as vanilla's, interleaved in the run
    with (runs / NAME / "summary.csv").open() as f:
        assert {row["task"]: float(row["exact_match"]) for row in csv.DictReader(f)}["overall"] == 1.0
    report = subprocess.run([sys.executable, "-m", "bench.report", str(runs), "--out", str(tmp_path / "report")],
                            cwd=project, check=True, capture_output=True, text=True)
    leaderboard = (tmp_path / "report" / "leaderboard.md").read_text()
    assert f"| {NAME} " in leaderboard and leaderboard in report.stdout
    assert changed_files(project) == set(ADDED)  # the run and the report wrote nothing into the code


@pytest.mark.real_model
def test_a_new_methods_parity_file_runs_through_the_protocol_into_a_record(project, tmp_path):
    subprocess.run([sys.executable, "-m", "bench.parity", "--methods", NAME, "--questions", "81",
                    "--max-new-tokens", "16", "--out", str(tmp_path / "parity")], cwd=project, check=True,
                   capture_output=True, text=True)
    with (tmp_path / "parity" / "smollm2_135m" / "parity.csv").open() as f:
        [row] = list(csv.DictReader(f))
    assert (row["parity_file"], row["method"], row["prompts"], row["tokens_equal"]) == (NAME, NAME, "2", "True")
    assert float(row["our_mat"]) == float(row["upstream_mat"]) >= 1.0  # both sides ours: the same tokens and steps
    assert changed_files(project) == set(ADDED)
