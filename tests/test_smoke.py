"""bench.smoke's orchestration: method discovery, skipping methods that lack artifacts, failing on errors,
report + regress at the end (runs are hand-built here; the real smoke runs SmolLM2 in CI)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench import smoke as smoke_module
from bench.artifacts import PROJECT_ROOT
from bench.errors import MissingArtifactError
from tests.report_fixtures import BASE_TIME, QUESTIONS, method_run, record, vanilla_records, write_run


def test_methods_are_every_method_config_vanilla_first():
    methods = smoke_module.available_methods()
    assert methods[0] == "vanilla"
    assert sorted(methods) == sorted(p.stem for p in (PROJECT_ROOT / "conf" / "method").glob("*.yaml"))


BFLOAT16_DIVERGENCE = {"turn": 0, "position": 3, "logit_gap": 0.125, "check_gap": 0.02, "tie_distance": 0.02,
                       "numeric_tie": True}


def fake_run_method(method: str, out_dir: Path, overrides: list[str]) -> None:
    """Stands in for a real run: writes a hand-built run, or fails as a method without artifacts / a broken one."""
    if "model=smollm2_135m_bf16" in overrides:  # the bfloat16 check: one question differs at BFLOAT16_DIVERGENCE
        assert "task=mt_bench" in overrides and "task=all" not in overrides
        answers = [record(321, "qa", method, [[1, 11]], [0.5], exact_match=False, divergence=BFLOAT16_DIVERGENCE),
                   record(481, "rag", method, [[1, 11]], [0.5])]
        write_run(out_dir, method, answers, vanilla_records(BASE_TIME))
        return
    assert "task=all" in overrides and "task.limit=1" in overrides
    if method == "vanilla":
        write_run(out_dir, "vanilla", vanilla_records(BASE_TIME))
    elif method == "pld":
        method_run(out_dir, "pld", {qid: 2.0 for qid, _ in QUESTIONS}, [1, 3, 3, 3, 2])
    elif method == "rest":
        raise MissingArtifactError("REST datastore x not found; build it with: python -m bench.datastore")
    else:
        raise RuntimeError(f"{method} is broken")


def test_smoke_skips_missing_artifacts_fails_on_errors_and_checks_the_baseline(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(smoke_module, "run_method", fake_run_method)
    out, baseline = tmp_path / "smoke", tmp_path / "baseline.json"
    overrides = list(smoke_module.DEFAULT_OVERRIDES)

    assert smoke_module.smoke(out, ["vanilla", "pld", "rest"], overrides, baseline) == 2  # no baseline yet
    assert "python -m bench.smoke --update" in capsys.readouterr().out
    assert smoke_module.smoke(out, ["vanilla", "pld", "rest"], overrides, baseline, update=True) == 0
    assert (out / "report" / "leaderboard.md").exists() and baseline.exists()
    assert smoke_module.smoke(out, ["vanilla", "pld", "rest"], overrides, baseline) == 0
    text = capsys.readouterr().out
    assert "skipped rest: REST datastore x not found" in text and "regress: passed" in text

    assert smoke_module.smoke(out, ["vanilla", "pld", "sps"], overrides, baseline) == 1
    text = capsys.readouterr().out
    assert "FAILED sps:" in text and "RuntimeError: sps is broken" in text
    assert smoke_module.smoke(out, ["vanilla"], overrides, baseline) == 1  # pld is in the baseline, not skipped
    assert "FAIL  7 baseline method x task entries are not in these runs: 1 method(s) not run (pld)" in \
        capsys.readouterr().out


def test_smoke_fails_when_a_bfloat16_divergence_is_not_a_proven_tie(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(smoke_module, "run_method", fake_run_method)
    out, baseline = tmp_path / "smoke", tmp_path / "baseline.json"
    overrides = list(smoke_module.DEFAULT_OVERRIDES)
    assert smoke_module.smoke(out, ["vanilla", "pld"], overrides, baseline, update=True) == 0
    assert "bfloat16 check: 2 questions, 1 exact, 1 numeric tie(s) proven in float32, 0 failure(s)" in \
        capsys.readouterr().out
    monkeypatch.setitem(BFLOAT16_DIVERGENCE, "numeric_tie", False)
    assert smoke_module.smoke(out, ["vanilla", "pld"], overrides, baseline) == 1
    text = capsys.readouterr().out
    assert "regress: passed" in text and "FAILED the bfloat16 check" in text and "question 321" in text


def test_smoke_never_wipes_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit, match="not made by bench.smoke"):
        smoke_module.fresh_folder(tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_methods_flag_names_the_mistake(capsys):
    with pytest.raises(SystemExit):
        smoke_module.main(["--methods", "medusa", "hydra"])
    assert ("not a Hydra override (key=value): hydra; --methods takes one comma-separated list: "
            "--methods medusa,hydra") in capsys.readouterr().err
    methods = ", ".join(sorted(p.stem for p in (PROJECT_ROOT / "conf" / "method").glob("*.yaml")))
    with pytest.raises(SystemExit):
        smoke_module.main(["--methods", "medusa,medussa"])
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"python -m bench.smoke: error: method=medussa: no conf/method/medussa.yaml; methods: {methods}"
    with pytest.raises(SystemExit):
        smoke_module.main(["--methods", "pld", "model=nosuch"])
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "python -m bench.smoke: error: model=nosuch: no conf/model/nosuch.yaml; models: ")
