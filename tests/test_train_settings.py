"""The training command's typed boundary (bench/train.py, methods/heads/settings.py TrainingRun): every training
value is checked before the target loads, and a bad one is refused in one line naming its key, exit status 2."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

import bench.train
import methods.heads.training
import methods.sps.train
from bench.artifacts import PROJECT_ROOT
from bench.errors import ConfigError
from methods.heads.settings import FeatureSettings, TrainingRun, TrainSettings
from methods.sps.settings import SpsTrainSettings


def train_config(*overrides: str):
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize("overrides, line", [
    (["method=medusa", "train.dtype=fp8"], "train.dtype=fp8: must be auto, float32 or bfloat16"),
    (["method=medusa", "features.source=web"], "features.source=web: must be sharegpt or self_distill"),
    (["method=medusa", "features.dtype=int8"], "features.dtype=int8: must be bfloat16, float16 or float32"),
    (["method=hydra", "train.lr=-1"], "train.lr=-1: must be a number > 0"),
    (["method=eagle", "train.batch_size=0"], "train.batch_size=0: must be a whole number >= 1"),
    (["method=eagle3", "train.betas=[0.9,1.5]"], "train.betas=[0.9, 1.5]: must be two numbers in [0, 1)"),
    (["method=medusa", "train.draft_vocab_size=0"], "train.draft_vocab_size=0: must be a whole number >= 1"),
    (["method=medusa", "train.resume=maybe"], "train.resume=maybe: must be true or false"),
    (["method=hydra", "train.num_heads=0"], "train.num_heads=0: must be a whole number >= 1"),
    (["method=eagle3", "train.soft_top_k=-1"], "train.soft_top_k=-1: must be a whole number >= 0"),
    (["method=eagle", "train.recipe.noise=-0.2"], "train.recipe.noise=-0.2: must be a number >= 0"),
    (["method=medusa", "features.source=self_distill", "features.self_distill.num_prompts=0"],
     "features.self_distill.num_prompts=0: must be a whole number >= 1"),
    (["method=medusa", "train.backend=trt"], "train.backend=trt: must be native or modelopt"),
    (["method=medusa", "train.backend=modelopt", "features.layers=[2]"],
     "features.layers=[2]: ModelOpt's Medusa heads read the last hidden state; set features.layers=[-1]"),
    (["method=medusa", "features.num_sequences=32", "features.shard_sequences=32"],
     "features.num_sequences=32: leaves nothing to train on after the 32 held out (features.heldout_shards=1); "
     "raise it"),
    (["method=sps", "features.source=self_distill", "features.self_distill.num_prompts=30"],
     "features.self_distill.num_prompts=30: leaves nothing to train on after the 32 held out "
     "(features.heldout_shards=1); raise it"),
    (["method=sps", "train.eval_draft_tokens=0"], "train.eval_draft_tokens=0: must be a whole number >= 1"),
    (["method=sps", "train.minutes=-2"], "train.minutes=-2: must be a number >= 0"),
    (["method=sps", "train.layers=[]"], "train.layers=[]: must be a list of target layer indices"),
    (["method=sps", "model=qwen25_coder_1p5b"], "method.drafter.draft_path=model:qwen25_coder_0p5b: a released "
     "model, not trained here; set method.drafter.draft_path=artifacts/sps/qwen25_coder_1p5b to train a draft of its "
     "own"),
])
def test_a_bad_training_value_is_one_line_and_exit_2_before_the_target_loads(overrides, line, monkeypatch, capsys):
    for trainer in (methods.heads.training, methods.sps.train):
        monkeypatch.setattr(trainer, "load_model", lambda *args, **kwargs: pytest.fail("the target was loaded"))
    with pytest.raises(SystemExit) as exit_:
        bench.train.train(train_config(*overrides))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {line}"]


def test_the_training_command_refuses_a_bad_value_in_one_line():
    done = subprocess.run([sys.executable, "-m", "bench.train", "method=medusa", "train.dtype=fp8"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr.splitlines()) == (2, ["error: train.dtype=fp8: must be auto, float32 or "
                                                               "bfloat16"])


def test_the_shipped_recipes_have_no_problems_and_the_run_is_the_float32_targets():
    for method, stint in [("medusa", TrainSettings), ("eagle", TrainSettings), ("eagle2", TrainSettings),
                          ("eagle3", TrainSettings), ("hydra", TrainSettings), ("sps", SpsTrainSettings)]:
        cfg = train_config(f"method={method}", "features.source=self_distill")
        run = TrainingRun.from_config(cfg, stint)
        assert type(run.train) is stint and run.features.problems() == [] and run.train.problems() == []
        assert run.model.dtype == run.features.model["dtype"] == run.features.answers.model["dtype"] == "float32"


def test_an_evaluation_or_a_sharegpt_sps_stint_needs_no_training_shards():
    for overrides in (["method=medusa", "train.minutes=0"], ["method=sps"], ["method=sps", "train.minutes=0",
                                                                          "features.source=self_distill"]):
        cfg = train_config(*overrides, "features.num_sequences=32", "features.self_distill.num_prompts=32")
        run = TrainingRun.from_config(cfg, SpsTrainSettings if "method=sps" in overrides else TrainSettings)
        assert run.features.shards == run.features.heldout_shards == 1 and run.problems() == []


def test_the_first_problem_is_the_one_refused():
    cfg = train_config("method=medusa", "features.seq_len=0", "train.lr=0")
    assert FeatureSettings.from_config(cfg).problems() == ["features.seq_len=0: must be a whole number >= 1"]
    with pytest.raises(ConfigError, match=r"^features.seq_len=0: must be a whole number >= 1$"):
        TrainingRun.from_config(cfg)
