"""Run folders (bench/run_folder.py): the default out_dir names the settings that decide the answers, so a newcomer's
second and third commands get folders of their own and the first command, typed again, resumes its own."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config
from bench.measure.run import run
from bench.records import read_jsonl
from bench.run_folder import settings_identity, settings_label
from tests.conftest import tiny_overrides

README_FIRST = ("method=pld", "task=qa", "task.limit=2", "gen.max_new_tokens=12")  # README command 1, on the tiny model


def default_folder(checkpoint, *overrides):
    """The CLI's config for the tiny checkpoint with out_dir left to its default."""
    ours = [o for o in tiny_overrides(checkpoint, "unused") if not o.startswith(("out_dir=", "gen.max_new_tokens="))]
    return compose_config(*ours, *overrides)


def test_a_newcomers_next_commands_get_folders_of_their_own_and_the_first_resumes(tiny_checkpoint, tmp_path,
                                                                                 monkeypatch, one_thread):
    """README command 1, then a shorter run, then a sampled one, then README command 1 again: four runs, no error,
    three folders, the last run resuming the first's (it answers nothing new)."""
    monkeypatch.chdir(tmp_path)
    commands = [README_FIRST, ("method=pld", "task=qa", "task.limit=1", "gen.max_new_tokens=8"),
                ("method=pld", "task=qa", "task.limit=1", "gen.max_new_tokens=8", "gen.temperature=0.7"), README_FIRST]
    configs = [default_folder(tiny_checkpoint, *command) for command in commands]
    folders = [config.out_dir for config in configs]
    assert folders[0] == folders[3] and len(set(folders)) == 3
    assert folders[0].startswith("results/runs/tiny/pld/qa-12tok-")
    assert folders[2].startswith("results/runs/tiny/pld/qa-8tok-t0.7-s0-")
    first = None
    for config in configs:
        run(config)
        if first is None:
            first = [a["answer_id"] for a in read_jsonl(tmp_path / folders[0] / "answers.jsonl")]
    assert [a["answer_id"] for a in read_jsonl(tmp_path / folders[0] / "answers.jsonl")] == first  # resumed
    saved = json.loads((tmp_path / folders[2] / "settings.json").read_text())
    assert saved["gen.temperature"] == 0.7 and saved["gen.max_new_tokens"] == 8 and "task.limit" not in saved


def test_the_label_reads_the_budget_and_sampling_and_hashes_every_knob(tiny_checkpoint):
    base = default_folder(tiny_checkpoint, *README_FIRST)
    knob = default_folder(tiny_checkpoint, *README_FIRST, "method.drafter.num_pred_tokens=5")
    more = default_folder(tiny_checkpoint, *README_FIRST[:2], "task.limit=5", README_FIRST[3])
    assert settings_label(base) != settings_label(knob) and settings_label(base) == settings_label(more)
    identity = settings_identity({"gen": {"max_new_tokens": 8}, "method": {"name": "pld", "sizing": "auto"}})
    assert identity["gen.max_new_tokens"] == 8 and identity["method.budget"] == "auto"  # sizing under one name


def test_the_cli_refuses_a_folder_of_other_settings_in_one_line(tiny_checkpoint, tmp_path):
    """A clash is refused before the model loads: exit status 2, one line naming both settings, no advice to delete."""
    folder = tmp_path / "mine"
    run(compose_config(*tiny_overrides(tiny_checkpoint, folder), "method=pld", "task=qa", "task.limit=1"))
    command = [sys.executable, "-m", "bench", *tiny_overrides(tiny_checkpoint, folder), "method=pld", "task=qa",
               "task.limit=1", "gen.temperature=0.7"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: out_dir={folder} holds answers made with gen.temperature=0.0; this command asks gen.temperature=0.7: "
        f"pass another out_dir=..., or leave out_dir unset to get a folder of its own for each setting"]
    assert "delete" not in done.stderr


@pytest.mark.parametrize("server", ["vllm", "llamacpp_ngram"])
def test_server_runs_name_their_settings_too(server):
    config = compose_config(f"server={server}", "backend=server", "gen.max_new_tokens=64")
    assert "/server-" in config.out_dir and "-c1-64tok-" in config.out_dir
