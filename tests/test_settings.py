"""The typed boundary (bench/validate.py, bench/settings.py, bench/knobs.py, bench/config.py): every bad value,
drafter knobs included, and every unknown config choice or key is refused in one line naming it, before anything
loads; the same line whether the run's entry or the drafter's constructor finds it; old spellings fold in one place."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.utils import get_class

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config, config_choices, unknown_choices
from bench.errors import ConfigError
from bench.knobs import knob_problems, knob_types
from bench.settings import Bootstrap, DrafterSettings, Generation, MethodSettings, RunSettings
from bench.validate import validate


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        validate(compose_config(*overrides))
    return str(error.value)


@pytest.mark.parametrize("override, line", [
    ("method.drafter.num_pred_tokens=-1", "method.drafter.num_pred_tokens=-1: must be >= 1"),
    ("method.drafter.match=nearest", "method.drafter.match=nearest: must be one of latest, first"),
    ("method.drafter.max_ngram_size=three", "method.drafter.max_ngram_size=three: must be an integer"),
    ("method.drafter.max_ngram_size=true", "method.drafter.max_ngram_size=true: must be an integer"),
    ("method.drafter.max_ngram_size=2.5", "method.drafter.max_ngram_size=2.5: must be an integer"),
    ("+method.drafter.num_pred_token=3", "method.drafter.num_pred_token=3: PromptLookupDrafter has no such knob; "
                                         "its knobs: max_ngram_size, num_pred_tokens, match"),
])
def test_a_bad_pld_knob_is_one_line(override, line):
    assert refusal("method=pld", override) == line


@pytest.mark.parametrize("method, override, line", [
    ("lookahead", "method.drafter.ngram_size=2", "method.drafter.ngram_size=2: must be >= 3"),
    ("lookahead", "method.drafter.slide=two", "method.drafter.slide=two: must be one of accepted, one"),
    ("recycling", "method.drafter.k=4", "method.drafter.k=4: must exceed every rank of the template (max rank 7)"),
    ("recycling", "method.drafter.template=[[0],[0,0,0]]",
     "method.drafter.template=[[0], [0, 0, 0]]: must list a tree's choices: tree template nodes without their parent: "
     "[[0, 0, 0]]"),
    ("recycling", "method.drafter.carry_over=maybe", "method.drafter.carry_over=maybe: must be true or false"),
    ("samd", "method.drafter.fallback=eagle3",
     "method.drafter.fallback=eagle3: must be one of recycling, eagle2, none"),
    ("samd", "method.drafter.n_predicts=1", "method.drafter.n_predicts=1: must be >= 2"),
    ("samd", "method.drafter.recycling.k=0",
     "method.drafter.recycling.k=0: must exceed every rank of the template (max rank 6)"),
    ("samd", "+method.drafter.recycling.kk=0", "method.drafter.recycling.kk=0: RecyclingDrafter has no such knob; "
                                               "its knobs: k, template, carry_over, seed_from_prefill, vocab_size"),
    ("rest", "method.drafter.max_token_span=1", "method.drafter.max_token_span=1: must be >= 2"),
    ("suffix", "method.drafter.min_token_prob=1.5", "method.drafter.min_token_prob=1.5: must be in [0, 1]"),
    ("suffix", "method.drafter.max_tree_depth=0", "method.drafter.max_tree_depth=0: must be >= 1"),
    ("rest", "method.drafter.num_draft=null", "method.drafter.num_draft=null: must be an integer"),
])
def test_each_training_free_drafter_refuses_a_bad_knob_in_one_line(method, override, line):
    assert refusal(f"method={method}", override) == line


@pytest.mark.parametrize("method, knob, value", [
    ("pld", "num_pred_tokens", 0), ("lookahead", "window_size", 1), ("lookahead", "max_accept", "all"),
    ("recycling", "k", 2), ("samd", "len_threshold", 0), ("samd", "fallback", "eagle3"), ("rest", "num_draft", 0),
])
def test_the_constructor_refuses_with_the_line_of_the_entry(method, knob, value):
    """One rule, two callers: what validate() says of a config is what the drafter says when built with it."""
    entry = refusal(f"method={method}", f"method.drafter.{knob}={value}")
    drafter = get_class(compose_config(f"method={method}").method.drafter._target_)
    knobs = {"datastore": {"path": "/nowhere"}} if method == "rest" else {}
    with pytest.raises(ValueError) as error:
        drafter(**knobs, **{knob: value})
    assert str(error.value) == entry


def test_trained_drafters_get_the_signature_checks_and_injected_objects_are_not_knobs():
    eagle = get_class(compose_config("method=eagle").method.drafter._target_)
    assert list(knob_types(eagle)) == ["checkpoint", "choices", "seed"]
    eagle2 = get_class(compose_config("method=eagle2").method.drafter._target_)
    assert list(knob_types(eagle2)) == ["checkpoint", "total_token", "depth", "top_k", "seed"]
    assert knob_problems(eagle2, {"depth": "deep", "seed": None}) == ["method.drafter.depth=deep: must be an integer"]
    assert refusal("method=medusa", "method.drafter.tree_size=eight") == \
        "method.drafter.tree_size=eight: must be an integer or null"
    assert refusal("method=sps", "+method.drafter.draft_model=x").startswith(
        "method.drafter.draft_model=x: DraftModelDrafter has no such knob; its knobs: draft_path, num_draft_tokens")


def test_validate_returns_the_typed_settings():
    settings = validate(compose_config("method=pld", "gen.temperature=0", "gen.max_new_tokens=32",
                                       "method.sizing=auto", "task=qa", "task.limit=2"))
    assert isinstance(settings, RunSettings)
    assert settings.generation == Generation(32, 1, 0.0, 0, 1.0, ())
    assert settings.generation.greedy and isinstance(settings.generation.temperature, float)
    assert settings.method == MethodSettings("pld", "auto", DrafterSettings(
        "methods.pld.PromptLookupDrafter", {"max_ngram_size": 3, "num_pred_tokens": 10, "match": "latest"}))
    assert settings.method.label == "pld+auto" and (settings.task.name, settings.task.limit) == ("qa", 2)
    assert validate(compose_config("method=vanilla")).method == MethodSettings("vanilla", "upstream", None)


def test_the_settings_carry_the_tie_judge_the_starvation_threshold_and_the_bootstrap():
    settings = validate(compose_config("model=smollm2_135m_bf16", "starvation_threshold=0.5", "bootstrap.samples=7"))
    assert (settings.model.tie_margin, settings.model.tie_check_dtype) == (0.4, "float32")
    assert (settings.starvation_threshold, settings.bootstrap) == (0.5, Bootstrap(samples=7, seed=0))
    default = validate(compose_config()).model
    assert (default.tie_margin, default.tie_check_dtype) == (0.001, None)


def test_unknown_choices_list_the_conf_folder():
    methods = ", ".join(config_choices("method"))
    assert unknown_choices(["method=pdl", "task=qa", "gen.top_k=3"]) == \
        [f"method=pdl: no conf/method/pdl.yaml; methods: {methods}"]
    assert unknown_choices(["task=qa,nosuch"])[0].startswith("task=nosuch: no conf/task/nosuch.yaml; tasks: all, ")
    assert unknown_choices(["method=pld"], {"method": "train"}) == [
        "method=pld: no conf/train/pld.yaml; methods with a training recipe: " + ", ".join(config_choices("train"))]
    assert unknown_choices(["~server", "method=glob(*)", "hydra/launcher=basic"]) == []
    with pytest.raises(ConfigError, match=r"^model=nosuch: no conf/model/nosuch.yaml; models: .*smollm2_135m"):
        compose_config("model=nosuch")
    with pytest.raises(ConfigError, match=r"^gen.max_new_token=3: the config has no key gen.max_new_token "
                                          r"\(\+gen.max_new_token=3 adds one\)$"):
        compose_config("gen.max_new_token=3")


def test_train_max_minutes_folds_into_minutes_with_one_warning(monkeypatch, capsys):
    """bench.train's fold is what hands the trainer its stint: the older name wins over train.minutes."""
    from hydra import compose, initialize_config_dir

    import bench.train
    import methods.heads.training

    handed = []
    monkeypatch.setattr(methods.heads.training, "train_heads", lambda cfg, recipe: handed.append(cfg))
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["method=medusa", "train.minutes=5", "train.max_minutes=12"])
    bench.train.train(cfg)
    assert capsys.readouterr().err.splitlines() == ["warning: train.max_minutes=12 is deprecated: use train.minutes=12"]
    assert (handed[0].train.minutes, handed[0].train.config.max_minutes) == (12, None)


def _command(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("module, args, line", [
    ("bench", ["method=pld", "method.drafter.num_pred_tokens=-1"],
     "error: method.drafter.num_pred_tokens=-1: must be >= 1"),
    ("bench", ["method=pld", "method.drafter.num_pred_token=3"],
     "error: method.drafter.num_pred_token=3: PromptLookupDrafter has no such knob; its knobs: max_ngram_size, "
     "num_pred_tokens, match"),
    ("bench", ["method=lookahead", "method.drafter.seed=zero"], "error: method.drafter.seed=zero: must be an integer"),
    ("bench", ["method=nosuch"], "error: method=nosuch: no conf/method/nosuch.yaml; methods: "),
    ("bench", ["task=nosuch"], "error: task=nosuch: no conf/task/nosuch.yaml; tasks: "),
    ("bench", ["model=nosuch"], "error: model=nosuch: no conf/model/nosuch.yaml; models: "),
    ("bench.train", ["method=nosuch"],
     "error: method=nosuch: no conf/train/nosuch.yaml; methods with a training recipe: "),
])
def test_the_commands_refuse_in_one_line_with_status_2_before_any_model_work(tmp_path, module, args, line):
    result = _command(module, *args, f"out_dir={tmp_path}")
    assert result.returncode == 2
    [said] = result.stderr.splitlines()
    assert said.startswith(line) and (said == line or line.endswith(": "))
    assert list(tmp_path.iterdir()) in ([], [tmp_path / ".hydra-logs"])  # no answers, no meta.json


@pytest.mark.parametrize("overrides, line", [
    (["method=eagle2", "method.drafter.depth=-1"], "method.drafter.depth=-1: must be >= 0"),
    (["method=eagle3", "method.drafter.total_token=1"], "method.drafter.total_token=1: must be >= 2"),
    (["method=medusa", "method.drafter.tree_size=0"], "method.drafter.tree_size=0: must be >= 1"),
    (["method=hydra", "method.drafter.choices=[[0],[1,0],[2,0,0]]"],
     "method.drafter.choices=[[0], [1, 0], [2, 0, 0]]: must be a tree named in methods/heads/trees.py or a list of "
     "choices (Medusa choice [1, 0] has no parent [1] in the choices list)"),
    (["method=eagle", "method.drafter.choices=wide"], "method.drafter.choices=wide: must be a tree named in "
     "methods/heads/trees.py or a list of choices (unknown tree 'wide'; name one of ['eagle_7b_25', 'mc_sim_7b_63'] "
     "or give a list of choices)"),
    (["method=sps", "method.drafter.num_draft_tokens=0"], "method.drafter.num_draft_tokens=0: must be >= 1"),
    (["method=medusa", "model=llama31_8b"], "method.drafter.checkpoint: not set for this model; set it on the "
     "command line (method.drafter.checkpoint=...) or in conf/method_model/medusa/<model>.yaml"),
])
def test_trained_drafters_refuse_bad_values_in_one_line(overrides, line):
    assert refusal(*overrides) == line


def test_a_trained_drafter_refuses_in_its_constructor_with_the_entry_line():
    """The rule lives on the drafter class: building it with the bad value says the entry's line."""
    drafter = get_class(compose_config("method=eagle2").method.drafter._target_)
    with pytest.raises(ValueError) as error:
        drafter(None, top_k=0)
    assert str(error.value) == refusal("method=eagle2", "method.drafter.top_k=0")
