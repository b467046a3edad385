"""method.sizing (conf/method/shared/speculation.yaml): one key for the planner's sizing at every batch size; its
old spellings method.budget=auto and method.batch_policy=adaptive still work, with one deprecation line; run keys
are those of the code before the rename."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench import label_of, sizing_of
from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config, fold_deprecated
from bench.errors import ConfigError
from bench.measure.backends.engine import engine_key_inputs
from bench.measure.protocol import run_keys
from bench.measure.run import run
from bench.records import config_key, read_jsonl
from tests.conftest import folder_stem

CPU = torch.device("cpu")


def raw_config(*overrides: str):
    """conf/config.yaml as Hydra composes it for `python -m bench`, before bench.config folds the old spellings."""
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("old, new", [("method.budget=auto", "auto"), ("method.batch_policy=adaptive", "auto"),
                                      ("method.budget=upstream", "upstream"),
                                      ("method.batch_policy=always", "upstream")])
def test_old_spellings_compose_to_the_same_policy_with_one_deprecation_line(capsys, batch, old, new):
    plain = compose_config("method=pld", f"gen.batch_size={batch}", f"method.sizing={new}")
    assert capsys.readouterr().err == ""
    folded = compose_config("method=pld", f"gen.batch_size={batch}", old)
    key = old.split("=")[0]
    assert capsys.readouterr().err.splitlines() == [f"warning: {old} is deprecated: use method.sizing={new}"]
    assert OmegaConf.to_container(folded.method) == OmegaConf.to_container(plain.method)
    assert folded.method.sizing == new and OmegaConf.select(folded, key) is None
    assert folded.out_dir == plain.out_dir
    assert run_keys(engine_key_inputs(folded, CPU, None)) == run_keys(engine_key_inputs(plain, CPU, None))
    fold_deprecated(folded)  # folded once: a second fold (run() after compose_config) says nothing
    assert capsys.readouterr().err == ""


def test_an_old_spelling_of_no_meaning_or_asking_vanilla_for_sizing_is_refused_in_one_line(capsys):
    with pytest.raises(ConfigError) as error:
        compose_config("method=pld", "method.budget=sometimes")
    assert str(error.value) == "method.budget=sometimes: must be upstream or auto (deprecated: method.sizing)"
    with pytest.raises(ConfigError) as error:
        compose_config("method=vanilla", "+method.batch_policy=adaptive", "+method.budget=upstream")
    assert str(error.value) == \
        "method.batch_policy=adaptive: method=vanilla drafts nothing, so there is nothing to size"
    assert capsys.readouterr().err == ""


def test_the_cli_folds_an_old_spelling_before_naming_its_folder():
    """Hydra resolves out_dir (its log folder) before run() folds: the label reads the old spellings too."""
    raw = raw_config("method=pld", "gen.batch_size=4", "method.batch_policy=adaptive")
    assert raw.method.batch_policy == "adaptive" and raw.method.sizing == "upstream"
    assert folder_stem(raw.out_dir).endswith("/pld+auto/mt_bench-batch4")
    assert folder_stem(raw_config("method=pld", "method.budget=auto").out_dir).endswith("/pld+auto/mt_bench")
    assert folder_stem(raw_config("method=pld", "method.sizing=auto").out_dir).endswith("/pld+auto/mt_bench")
    assert folder_stem(raw_config("method=pld", "gen.batch_size=4").out_dir).endswith("/pld/mt_bench-batch4")


def test_labels_and_sizing_of_meta_json_configs_old_and_new():
    assert [label_of(m) for m in ({"name": "pld", "sizing": "auto"}, {"name": "pld", "budget": "auto"},
                                  {"name": "pld", "budget": "upstream", "batch_policy": "adaptive"},
                                  {"name": "pld", "budget": "upstream", "batch_policy": "always"},
                                  {"name": "vanilla", "drafter": None})] == \
        ["pld+auto", "pld+auto", "pld+auto", "pld", "vanilla"]
    assert sizing_of({"sizing": "upstream", "budget": None, "batch_policy": None}) == "upstream"


def test_cli_prints_the_deprecation_line_once(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench", "method=pld", "method.budget=auto",
                             "gen.max_new_tokens=0", f"out_dir={tmp_path}"], cwd=PROJECT_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["warning: method.budget=auto is deprecated: use method.sizing=auto",
                                          "error: gen.max_new_tokens=0: must be an integer >= 1"]


def fixed_config(batch: int, **sizing) -> OmegaConf:
    """A config of fixed content (no YAML involved), with the method's sizing keys given."""
    return OmegaConf.create({
        "model": {"name": "tiny", "dtype": "float32"},
        "gen": {"max_new_tokens": 32, "batch_size": batch, "temperature": 0.0}, "seed": 0,
        "task": {"source": {"kind": "jsonl", "path": "q.jsonl"}},
        "method": {"name": "pld", **sizing,
                   "drafter": {"_target_": "methods.pld.PromptLookupDrafter", "num_pred_tokens": 10}}})


# (batch size, sizing) -> (baseline key, method key), computed by run_keys before method.sizing existed, on the
# config then written {"budget": sizing, "batch_policy": "always"}
KEYS_BEFORE = {(1, "upstream"): ("495ec44491defcef", "2ec68649886ab51a"),
               (4, "upstream"): ("ec4ffb02dc40dd78", "db01bc3bed9f1964"),
               (1, "auto"): ("495ec44491defcef", "a5662da9081ca54d"),
               (4, "auto"): ("ec4ffb02dc40dd78", "fa3b9e6bfadd441e")}


@pytest.mark.parametrize("batch, sizing", sorted(KEYS_BEFORE))
def test_run_keys_are_those_before_the_rename(batch, sizing):
    new = fixed_config(batch, sizing=sizing, budget=None, batch_policy=None)
    old = fixed_config(batch, budget=sizing, batch_policy="always")
    assert run_keys(engine_key_inputs(new, CPU, None)) == run_keys(engine_key_inputs(old, CPU, None)) == \
        KEYS_BEFORE[batch, sizing]
    vanilla = OmegaConf.merge(fixed_config(1), {"method": {"name": "vanilla", "drafter": None}})
    assert run_keys(engine_key_inputs(vanilla, CPU, None)) == ("495ec44491defcef", "08fa09c9c6916ea1")


def test_the_default_composed_config_keeps_its_run_key():
    """The method key of `method=pld` (eager) hashes what the code before the rename hashed: the method config with
    budget=upstream and without batch_policy. engine.compile=auto's run at 1024 tokens is the compiled run."""
    assert run_keys(engine_key_inputs(compose_config("method=pld"), CPU, None)) == run_keys(
        engine_key_inputs(compose_config("method=pld", "engine.compile=on"), CPU, None))
    cfg = compose_config("method=pld", "engine.compile=off")
    method = OmegaConf.to_container(cfg.method)
    before = {**{k: v for k, v in method.items() if k not in ("sizing", "budget", "batch_policy")},
              "budget": "upstream"}
    setting = {"model": OmegaConf.to_container(cfg.model, resolve=True), "device": "cpu",
               "gen": {k: v for k, v in OmegaConf.to_container(cfg.gen, resolve=True).items() if k != "batch_size"},
               "seed": cfg.seed, "source": OmegaConf.to_container(cfg.task.source, resolve=True)}
    assert run_keys(engine_key_inputs(cfg, CPU, None)) == (config_key(**setting),
                                                           config_key(**setting, method=before, artifact=None))


def test_a_batched_run_under_an_old_spelling_is_planned_and_labelled_auto(compose, tmp_path, capsys):
    run(compose("method=pld", "method.batch_policy=adaptive", "gen.batch_size=2", "task=qa", "task.limit=2"))
    assert "warning: method.batch_policy=adaptive is deprecated: use method.sizing=auto" in capsys.readouterr().err
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    assert {a["method"] for a in answers} == {"pld+auto"} and all(a["exact_match"] for a in answers)
    assert list((tmp_path / "profiles").glob("tiny-*b2-*.json"))  # the planner's profile at batch 2, made for it
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["config"]["method"]["sizing"] == "auto" and meta["config"]["method"]["batch_policy"] is None
