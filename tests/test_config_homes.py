"""A method's settings have one home per (method, model): conf/method/<m>.yaml holds upstream's defaults,
conf/method_model/<m>/<model>.yaml the model's own (checkpoint, tree), picked by Hydra after both are chosen; the
model YAMLs hold none, and every trainer writes to the checkpoint its drafter reads."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config

CONF = PROJECT_ROOT / "conf"
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
HOMES = sorted((p.parent.name, p.stem) for p in (CONF / "method_model").glob("*/*.yaml"))


def home(method: str, model: str):
    return CONF / "method_model" / method / f"{model}.yaml"


OWN_SETTINGS = [(method, model) for method, model in HOMES if "drafter" in OmegaConf.load(home(method, model))]
WITHOUT_HOME = [(method, model) for method in METHODS for model in MODELS if (method, model) not in HOMES]


def drafter(method: str, model: str, *overrides: str) -> dict:
    """cfg.method.drafter of `python -m bench method=<method> model=<model> ...`, unresolved."""
    return OmegaConf.to_container(compose_config(f"method={method}", f"model={model}", *overrides).method)["drafter"]


def train_config(method: str, model: str = "smollm2_135m"):
    """conf/train.yaml as `python -m bench.train method=<method> model=<model>` composes it."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=[f"method={method}", f"model={model}"])


def test_every_method_with_per_model_settings_has_a_home_for_smollm2():
    assert [m for m, model in OWN_SETTINGS if model == "smollm2_135m"] == [
        "dflash", "eagle", "eagle2", "eagle3", "hydra", "medusa", "mlp_speculator", "pard", "redrafter", "samd",
        "sps"]


@pytest.mark.parametrize("method, model", OWN_SETTINGS)
def test_the_homes_settings_reach_the_drafter(method, model):
    """Every key the file sets is the composed drafter's value, at any depth (samd's drafter.eagle2.*)."""
    own = OmegaConf.to_container(OmegaConf.load(home(method, model)).drafter)
    composed = drafter(method, model)

    def check(expected: dict, got: dict, path: str) -> None:
        for key, value in expected.items():
            if isinstance(value, dict):
                check(value, got[key], f"{path}.{key}")
            else:
                assert got[key] == value, f"{path}.{key}"

    check(own, composed, "method.drafter")


def test_smollm2s_cpu_trees_and_checkpoints_are_the_shipped_ones():
    assert drafter("medusa", "smollm2_135m")["tree_size"] == 8
    assert drafter("hydra", "smollm2_135m")["tree_size"] == 16
    assert [drafter("eagle2", "smollm2_135m")[k] for k in ("total_token", "depth", "top_k")] == [6, 2, 2]
    assert [drafter("eagle3", "smollm2_135m")[k] for k in ("total_token", "depth", "top_k")] == [8, 3, 2]
    assert drafter("sps", "smollm2_135m")["draft_path"] == "artifacts/sps/smollm2_135m"
    assert drafter("samd", "smollm2_135m")["eagle2"]["checkpoint"] == "artifacts/eagle/smollm2_135m"


@pytest.mark.parametrize("method", ["medusa", "hydra"])
def test_the_command_line_wins_over_the_home(method):
    assert drafter(method, "smollm2_135m", "method.drafter.tree_size=32")["tree_size"] == 32
    assert drafter(method, "smollm2_135m", "method.drafter.tree_size=null")["tree_size"] is None


@pytest.mark.parametrize("method", ["medusa", "hydra", "eagle", "sps"])
def test_the_bfloat16_model_has_the_float32_models_settings(method):
    assert drafter(method, "smollm2_135m_bf16") == drafter(method, "smollm2_135m")


def test_eagle2_and_eagle3_in_bfloat16_draft_their_own_tree_and_samd_falls_back_to_it():
    """The float32 heads with the tree measured for bfloat16 (one level, wider); SAMD falls back to EAGLE-2's."""
    tree = {"total_token": 8, "depth": 1, "top_k": 4}
    for method in ("eagle2", "eagle3"):
        assert drafter(method, "smollm2_135m_bf16") == {**drafter(method, "smollm2_135m"), **tree}
    assert drafter("samd", "smollm2_135m_bf16") == {**drafter("samd", "smollm2_135m"),
                                                     "eagle2": {**drafter("samd", "smollm2_135m")["eagle2"], **tree}}


@pytest.mark.parametrize("method, model", WITHOUT_HOME)
def test_a_model_without_a_home_gets_the_upstream_defaults(method, model):
    upstream = OmegaConf.to_container(OmegaConf.load(CONF / "method" / f"{method}.yaml"))["drafter"]
    assert drafter(method, model) == upstream


def test_upstream_defaults_leave_the_artifact_to_set():
    """llama31_8b has no Medusa heads: the full mc_sim_7b_63 tree, and a checkpoint the user must give."""
    cfg = compose_config("method=medusa", "model=llama31_8b")
    assert (cfg.method.drafter.choices, cfg.method.drafter.tree_size) == ("mc_sim_7b_63", None)
    assert OmegaConf.is_missing(cfg.method.drafter, "checkpoint")
    assert compose_config("method=eagle2", "model=llama31_8b").method.drafter.total_token == 60


@pytest.mark.parametrize("model", MODELS)
def test_model_yamls_hold_no_method_settings(model):
    keys = set(OmegaConf.load(CONF / "model" / f"{model}.yaml"))
    assert keys & {*METHODS, "sps_draft"} == set()


def test_no_config_reads_a_method_setting_from_the_model():
    readers = [str(p.relative_to(CONF)) for p in CONF.rglob("*.yaml")
               if any(f"model.{name}" in p.read_text() for name in (*METHODS, "sps_draft"))]
    assert readers == []


@pytest.mark.parametrize("model", MODELS)
def test_eagle_eagle2_and_samds_fallback_share_one_head(model):
    """One head; the fallback's tree is method=eagle2's CPU tree, or SAM-Decoding's where eagle2 runs upstream's."""
    eagle, eagle2 = compose_config("method=eagle", f"model={model}"), compose_config("method=eagle2", f"model={model}")
    fallback = compose_config("method=samd", f"model={model}").method.drafter.eagle2
    assert OmegaConf.is_missing(eagle.method.drafter, "checkpoint") == (fallback.checkpoint is None)
    if fallback.checkpoint is not None:
        assert eagle.method.drafter.checkpoint == eagle2.method.drafter.checkpoint == fallback.checkpoint
    tree = ("total_token", "depth", "top_k")
    eagle2_tree = tuple(eagle2.method.drafter[k] for k in tree)
    sam_decodings = {(60, 5, 10): (63, 5, 8)}  # where EAGLE-2 runs its own tree, SAMD runs SAM-Decoding's
    assert tuple(fallback[k] for k in tree) == sam_decodings.get(eagle2_tree, eagle2_tree)


@pytest.mark.parametrize("method, artifact", [("medusa", "medusa"), ("hydra", "hydra"), ("eagle", "eagle"),
                                              ("eagle2", "eagle"), ("eagle3", "eagle3"),
                                              ("mlp_speculator", "mlp_speculator"), ("dflash", "dflash"),
                                              ("redrafter", "redrafter")])
def test_every_head_trainer_writes_the_checkpoint_its_drafter_reads(method, artifact):
    cfg = train_config(method)
    assert cfg.train.out_dir == cfg.method.drafter.checkpoint == f"artifacts/{artifact}/smollm2_135m"
    assert OmegaConf.to_container(cfg.method.drafter) == drafter(method, "smollm2_135m")


def test_the_sps_trainer_writes_the_draft_its_drafter_reads():
    """methods/sps/train.py writes to method.drafter.draft_path."""
    assert train_config("sps").method.drafter.draft_path == "artifacts/sps/smollm2_135m"


def test_the_pard_trainer_writes_the_draft_its_drafter_reads():
    cfg = train_config("pard")
    assert cfg.train.out_dir == cfg.method.drafter.draft_path == "artifacts/pard/smollm2_135m"
    assert cfg.train.init_draft == drafter("sps", "smollm2_135m")["draft_path"]
