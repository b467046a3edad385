"""Committed records (`python -m bench.report <runs> --record <experiment>`) and the docs' generated tables
(`python -m bench.report --docs [--check]`): a block holds exactly the table the report renders, the check fails on a
hand edit and on a missing record, and nothing outside the blocks changes. Also: the reference experiments compose,
and every block of README.md and docs/ names one."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config
from bench.report.__main__ import main
from bench.report.docs_blocks import FIX, MADE_BY, docs_files, find_blocks, how_to_make
from bench.report.parity_record import PARITY
from bench.report.render import write_report
from tests.report_fixtures import QUESTIONS, method_run

BEFORE = ("# Notes\n\nHand-written text, kept as it is: 1.23x.\n\n"
          "```\n<!-- specbench:table experiment=nothing -->\n```\n")  # a marker in a fence is text
AFTER = "\nMore text after the block.\n"


def block(attributes: str, inside: str = "to be filled") -> str:
    return f"<!-- specbench:table {attributes} -->\n{inside}\n<!-- /specbench:table -->\n"


@pytest.fixture
def made(tmp_path):
    """Two methods' runs, their record (made by the command) under tmp_path/reference and the report of the same
    runs under tmp_path/report. eagle2 left vanilla on one question (the report names it under its table)."""
    runs = tmp_path / "runs"
    method_run(runs / "pld", "pld", {q: 1.5 for q, _ in QUESTIONS}, [2, 1], model="smollm2_135m", dtype="float32")
    method_run(runs / "eagle2", "eagle2", {q: 1.2 + 0.05 * i for i, (q, _) in enumerate(QUESTIONS)}, [3],
               diverge={161: {"turn": 0, "position": 3, "logit_gap": 2.0, "numeric_tie": False}},
               model="smollm2_135m", dtype="float32")
    main([str(runs), "--record", "exp", "--reference", str(tmp_path / "reference")])
    write_report(runs, tmp_path / "report")
    return tmp_path


def docs(tmp_path: Path, *flags: str) -> int:
    """`python -m bench.report --docs tmp_path/doc.md [flags]` against tmp_path/reference; its exit status."""
    try:
        main(["--docs", str(tmp_path / "doc.md"), "--reference", str(tmp_path / "reference"), *flags])
    except SystemExit as exit_:
        return exit_.code
    return 0


def inside(text: str) -> str:
    """The content of the one marked block of `text` outside BEFORE's fence (markers not included)."""
    return re.search(r"^<!-- specbench:table (?!experiment=nothing)[^\n]* -->\n(.*?)^<!-- /specbench:table -->$",
                     text, re.S | re.M)[1]


def test_the_record_is_the_report_s_long_table_and_the_runs_facts(made, capsys):
    folder = made / "reference" / "exp" / "test-cpu"  # the fixture's device_name, "Test CPU"; no threads recorded
    assert sorted(p.name for p in folder.iterdir()) == ["leaderboard.csv", "meta.json"]
    assert (folder / "leaderboard.csv").read_text() == (made / "report" / "leaderboard.csv").read_text()
    meta = json.loads((folder / "meta.json").read_text())
    assert {k: meta[k] for k in ("experiment", "host_label", "device_name", "torch", "transformers", "git_commit",
                                 "first_started", "last_finished", "runs")} == {
        "experiment": "exp", "host_label": "test-cpu", "device_name": "Test CPU", "torch": "2.13.0",
        "transformers": "5.24.0", "git_commit": "abc", "first_started": "2026-01-01T00:00:00",
        "last_finished": "2026-01-01T00:00:00", "runs": 2}
    assert "--record exp" in meta["recorded_with"]


def test_runs_of_two_machines_make_no_record(tmp_path, capsys):
    method_run(tmp_path / "runs" / "pld", "pld", {321: 2.0}, [11], task="qa", device_name="CPU A")
    method_run(tmp_path / "runs" / "sps", "sps", {321: 1.5}, [11], task="qa", device_name="CPU B")
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "runs"), "--record", "exp", "--reference", str(tmp_path / "reference")])
    assert exit_.value.code == 2 and "runs of several machines (cpu-a, cpu-b)" in capsys.readouterr().err
    assert not (tmp_path / "reference").exists()


def served(url: str, host: str = "h") -> dict:
    """method_run's keys of a run against the server at `url`, the harness on `host`."""
    return {"device": "server:vllm", "device_name": f"vllm at {url}",
            "meta_extra": {"backend": "server", "server": {"url": url}, "host": host}}


def test_runs_against_a_server_on_the_same_machine_make_the_machine_s_record(tmp_path, capsys):
    """Our engine beside vLLM served on the same machine (bench.parity.engines): one record, labelled and described
    by the engine's own runs; a server elsewhere, or a harness on another host, is another machine."""
    runs, reference = tmp_path / "runs", tmp_path / "reference"
    method_run(runs / "ours", "eagle3", {321: 1.2}, [2], task="qa", device_name="CPU A")
    method_run(runs / "vllm", "vllm_cpu_eagle3", {321: 1.1}, [2], task="qa", **served("http://127.0.0.1:8301"))
    main([str(runs), "--record", "exp", "--reference", str(reference)])
    meta = json.loads((reference / "exp" / "cpu-a" / "meta.json").read_text())
    assert (meta["host_label"], meta["device_name"], meta["runs"]) == ("cpu-a", "CPU A", 2)
    for where, host in (("http://gpu-node:8000", "h"), ("http://localhost:8301", "elsewhere")):
        method_run(runs / "vllm", "vllm_cpu_eagle3", {321: 1.1}, [2], task="qa", **served(where, host))
        with pytest.raises(SystemExit) as exit_:
            main([str(runs), "--record", "exp2", "--reference", str(reference)])
        assert exit_.value.code == 2 and "runs of several machines" in capsys.readouterr().err
    assert not (reference / "exp2").exists()


@pytest.mark.parametrize("view, report_file, index", [("leaderboard", "leaderboard.md", 0),
                                                      ("cost", "leaderboard.md", 1),
                                                      ("acceptance", "acceptance.md", 0)])
def test_docs_fills_a_block_with_exactly_the_report_s_table_and_nothing_else(made, view, report_file, index):
    (made / "doc.md").write_text(BEFORE + block(f"experiment=exp view={view}") + AFTER)
    assert docs(made) == 0
    text = (made / "doc.md").read_text()
    assert text.startswith(BEFORE + f"<!-- specbench:table experiment=exp view={view} -->\n")
    assert text.endswith("<!-- /specbench:table -->\n" + AFTER)
    caption, table = inside(text).strip("\n").split("\n\n", 1)
    assert caption.startswith(f"Generated by `{FIX}` from `{made / 'reference' / 'exp' / 'test-cpu'}/`")
    assert "smollm2_135m, float32, Test CPU (cpu), greedy, max_new_tokens 32, 1 question per task" in caption
    report = (made / "report" / report_file).read_text()
    assert table.startswith(re.findall(r"^\|.*?(?=\n\n|\Z)", report, re.S | re.M)[index]) and table in report
    if view == "leaderboard":  # with the lines the report puts under it
        assert table.endswith("beyond numeric ties** (exact_match 0.833) on questions 161.")  # a number in the CSV


def test_check_passes_after_docs_and_fails_in_one_line_after_a_hand_edit(made, capsys):
    (made / "doc.md").write_text(BEFORE + block("experiment=exp") + AFTER)
    assert docs(made, "--check") == 1  # not rendered yet
    assert docs(made) == 0
    assert docs(made, "--check") == 0
    capsys.readouterr()
    text = (made / "doc.md").read_text()
    edited = text.replace("| pld | 1.50x |", "| pld | 1.55x |")
    assert edited != text
    (made / "doc.md").write_text(edited)
    assert docs(made, "--check") == 1
    assert capsys.readouterr().out == (f"{made / 'doc.md'}:8: block experiment=exp differs from "
                                       f"{made / 'reference' / 'exp' / 'test-cpu'}: run {FIX}\n")
    assert (made / "doc.md").read_text() == edited  # --check rewrites nothing
    assert docs(made) == 0 and (made / "doc.md").read_text() == text


def test_a_missing_record_fails_the_check_unless_the_block_allows_it(made, capsys):
    (made / "doc.md").write_text(BEFORE + block("experiment=later") + AFTER)
    assert docs(made, "--check") == 1
    line = capsys.readouterr().out
    assert line.startswith(f"{made / 'doc.md'}:8: block experiment=later: no record "
                           f"{made / 'reference' / 'later'}/<host>/ (make it: run `python -m bench "
                           f"+experiment=later -m` on a quiet machine")
    assert line.count("\n") == 1

    (made / "doc.md").write_text(BEFORE + block("experiment=later allow-missing") + AFTER)
    assert docs(made) == 0
    assert inside((made / "doc.md").read_text()).strip().startswith("*No record yet: run `python -m bench")
    assert docs(made, "--check") == 0
    assert capsys.readouterr().out.startswith(f"note: {made / 'doc.md'}:8: block experiment=later allow-missing: "
                                              f"no record")
    (made / "doc.md").write_text((made / "doc.md").read_text().replace("*No record yet", "| pld | 1.70x |\n*No"))
    assert docs(made, "--check") == 1  # allowed to be missing, not to hold figures typed by hand
    assert "differs from its placeholder" in capsys.readouterr().out


def test_host_picks_one_machine_s_record(made, capsys):
    (made / "reference" / "exp" / "other-2t").mkdir()
    (made / "reference" / "exp" / "other-2t" / "leaderboard.csv").write_text("")
    (made / "doc.md").write_text(block("experiment=exp"))
    assert docs(made) == 2
    assert "records of several machines (other-2t, test-cpu): name one with host=<label>" in capsys.readouterr().err
    (made / "doc.md").write_text(block("experiment=exp host=test-cpu"))
    assert docs(made) == 0 and "| pld | 1.50x |" in (made / "doc.md").read_text()


@pytest.mark.parametrize("text, error", [
    (block("experiment=exp view=plots"), "doc.md:1: view=plots: views are leaderboard, acceptance, cost"),
    (block("view=cost"), "doc.md:1: a block names its record's experiment=<name>"),
    (block("experiment=exp colour=red"), "doc.md:1: unknown attribute colour"),
    ("<!-- specbench:table experiment=exp -->\n| a |\n", "doc.md:1: block experiment=exp is not closed"),
    ("<!-- /specbench:table -->\n", "doc.md:1: a block closes unopened"),
])
def test_a_malformed_block_is_refused_in_one_line(made, capsys, text, error):
    (made / "doc.md").write_text(text)
    assert docs(made) == 2
    assert error in capsys.readouterr().err
    assert (made / "doc.md").read_text() == text


@pytest.mark.parametrize("experiment, dtype", [("reference_fp32", "float32"), ("reference_bf16", "bfloat16")])
def test_the_reference_experiments_compose(experiment, dtype):
    swept = compose_config(f"+experiment={experiment}", return_hydra_config=True).hydra.sweeper.params.method
    methods = swept.split(",")
    assert methods == ["pld", "eagle2", "eagle", "hydra", "medusa", "sps"]  # README's reference table
    for method in methods:
        cfg = compose_config(f"+experiment={experiment}", f"method={method}")
        assert (cfg.method.name, cfg.model.dtype, cfg.task.name, cfg.task.limit, cfg.gen.max_new_tokens,
                cfg.gen.temperature) == (method, dtype, "all", 5, 128, 0.0)
        assert cfg.out_dir.startswith(f"results/runs/{experiment}/{cfg.model.name}/{method}/all-128tok-")
    auto = compose_config(f"+experiment={experiment}", "method=eagle2", "method.sizing=auto")
    assert auto.out_dir.startswith(f"results/runs/{experiment}/{auto.model.name}/eagle2+auto/")


def test_every_block_of_readme_and_docs_names_an_experiment_of_conf():
    """... or one made by a command of its own (MADE_BY), which says where its runs go."""
    blocks = [b for path in docs_files() for b in find_blocks(path.read_text().split("\n"), path.name)]
    assert blocks and "reference_fp32" in {b.attributes["experiment"] for b in blocks}
    for b in blocks:
        experiment = b.attributes["experiment"]
        assert (PROJECT_ROOT / "conf" / "experiment" / f"{experiment}.yaml").is_file() or experiment in MADE_BY \
            or experiment == PARITY, b.name
    assert "`OMP_NUM_THREADS=1 python -m bench.parity`" in how_to_make(PARITY)
    for experiment, command in MADE_BY.items():
        assert f"results/runs/{experiment}" in how_to_make(experiment)
        assert subprocess.run([*command.replace("python", sys.executable, 1).split(), "--help"], cwd=PROJECT_ROOT,
                              capture_output=True).returncode == 0


def test_conf_carries_no_speedup_figures():
    found = subprocess.run(["grep", "-rnE", r"[0-9]\.[0-9]+x", "conf"], cwd=PROJECT_ROOT, capture_output=True,
                           text=True).stdout
    assert found == "", "speedups go in docs/, dated:\n" + found



def test_parity_blocks_render_bench_parity_s_rows_of_their_methods(tmp_path, capsys):
    """An experiment=parity block holds bench.parity's record rows of its `methods` (their notes under the table), a
    caption naming the record and the command that made them; without rows, the placeholder and a failed check."""
    from bench.parity.__main__ import write_records

    rows = [{"parity_file": "medusa", "method": "medusa", "settings": "tree [1, 7, 6]", "questions": "81,82",
             "prompts": 4, "max_new_tokens": 64, "our_mat": 1.631, "upstream_mat": 1.631, "difference": 0.0,
             "tokens_equal": True, "notes": "", "date": "2026-12-06"},
            {"parity_file": "suffix", "method": "suffix", "settings": "a chain", "questions": "81,82", "prompts": 4,
             "max_new_tokens": 64, "our_mat": 1.3, "upstream_mat": 1.25, "difference": 0.04, "tokens_equal": False,
             "divergence_prompt": 1, "divergence_token": 7, "numeric_tie": True,
             "notes": "drafts equal 190 of 193 steps | one more note", "date": "2026-12-06"}]
    write_records(tmp_path / "reference" / "parity" / "smollm2_135m" / "parity.csv", rows, {"medusa", "suffix"})
    (tmp_path / "doc.md").write_text(BEFORE + block("experiment=parity methods=suffix") + AFTER)
    assert docs(tmp_path) == 0
    text = (tmp_path / "doc.md").read_text()
    assert text.startswith(BEFORE) and text.endswith(AFTER)
    assert inside(text).split("\n")[1:] == [
        f"Generated by `python -m bench.report --docs` from `{tmp_path}/reference/parity/smollm2_135m/parity.csv` (do "
        "not edit by hand): smollm2_135m, float32, greedy, MT-bench 81,82 (both turns: 4 prompts), 64 new tokens, "
        "2026-12-06; made with `OMP_NUM_THREADS=1 python -m bench.parity --methods suffix`.", "",
        "| method | settings | our #MAT | upstream #MAT | difference | tokens equal |",
        "| --- | --- | --- | --- | --- | --- |",
        "| suffix | a chain | 1.300 | 1.250 | +4.0% | no: prompt 1, token 7 (numeric tie) |", "",
        "- drafts equal 190 of 193 steps", "- one more note", "", ""]
    assert docs(tmp_path, "--check") == 0
    capsys.readouterr()
    (tmp_path / "doc.md").write_text(BEFORE + block("experiment=parity methods=eagle3") + AFTER)
    assert docs(tmp_path, "--check") == 1  # no rows of eagle3's parity file: the block waits for them
    said = capsys.readouterr()
    assert "(make it: run `OMP_NUM_THREADS=1 python -m bench.parity`, then `python -m bench.report --docs`)" in \
        said.out + said.err


@pytest.mark.parametrize(("commands", "said"), [
    (["python -m bench method=pld", "python -m bench method=sps"],
     "made with `python -m bench method=pld`; `python -m bench method=sps`."),
    ([f"python -m bench method=m{i}" for i in range(4)],
     "made with the 4 commands listed in `results/reference/exp/host/meta.json`."),
])
def test_a_caption_names_a_few_commands_and_points_to_the_record_for_more(commands, said):
    import pandas as pd

    from bench.artifacts import PROJECT_ROOT
    from bench.report.docs_blocks import caption

    board = pd.DataFrame([{"model": "m", "dtype": "float32", "device_name": "CPU", "device": "cpu", "temperature": 0.0,
                           "max_new_tokens": 32, "task": "qa", "n_questions": 3}])
    meta = {"torch": "2.13.0", "first_started": "2026-12-06T10:00:00", "commands": commands}
    assert caption(PROJECT_ROOT / "results" / "reference" / "exp" / "host", meta, board).endswith(said)
