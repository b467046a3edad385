"""docs/layout.md's "adding a method" is true: a throwaway method added as it says (one folder methods/<name>/ with a
drafter, one YAML conf/method/<name>.yaml, one parity file bench/parity/methods/<name>.py), in a copy of the project
and with no other file touched, is in the smoke list, is one of the sampling test's cases, is on `python -m
bench.parity --list`, runs lossless on SmolLM2 and is in the report's leaderboard; one with weights (its training
recipe beside its drafter, conf/train/<name>.yaml, conf/method_model/<name>/<model>.yaml) trains them with `python -m
bench.train` and drafts with them."""
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

# A throwaway method with weights to train: its folder also holds the training recipe, conf/train/ its training
# settings, conf/method_model/ where its checkpoint is for the model (docs/layout.md's list, every place).
HEAD = "throwaway_head"
HEAD_RECIPE = f'''"""A throwaway recipe: a linear layer on the target's last feature guesses the token after next."""
from torch import nn


class NextNextHead(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, hidden_size)

    def logits(self, hidden, vocab):
        return vocab(self.proj(hidden))


class NextNextRecipe:
    method = "{HEAD}"

    def build(self, target, tcfg):
        return NextNextHead(target.get_output_embeddings().weight.shape[1])

    def loss(self, module, vocab, batch, target):
        keep = batch.mask[:, 1:]
        targets = vocab.slice_positions(batch.labels[:, 1:][keep])
        logits = module.logits(batch.hidden[:, :-1][keep], vocab)
        return nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100), [(logits.detach(), targets)]

    def checkpoint_config(self, module, tcfg):
        return {{}}
'''
HEAD_DRAFTER = f'''"""A throwaway method with a trained head: a chain of one draft, the head's guess."""
import torch

from bench.artifacts import artifact_fingerprint
from bench.engine.tree import DraftTree
from methods.heads.common import LastFeatureDrafter, checkpoint_folder
from methods.heads.saved import load_saved_heads
from methods.{HEAD}.train import NextNextHead


class NextNextDrafter(LastFeatureDrafter):
    def __init__(self, target, tokenizer=None, checkpoint: str = ""):
        folder = checkpoint_folder(checkpoint, "{HEAD}")
        lm_head = target.get_output_embeddings()
        head, self.vocab = load_saved_heads(folder, "{HEAD}", lambda config: NextNextHead(lm_head.weight.shape[1]),
                                            lm_head, "python -m bench.train method={HEAD}")
        self.head, self.artifact = head.to(target.device, target.dtype).eval(), artifact_fingerprint(folder)

    def most_nodes(self):
        return 1

    @torch.inference_mode()
    def propose(self, context, max_tokens):
        if max_tokens <= 1:
            return None
        position = self.head.logits(self.hidden, self.vocab).argmax(-1)
        return DraftTree.chain([int(self.vocab.to_token_ids(position))])
'''
HEAD_CONFIG = f'''defaults:
  - shared/speculation@_here_
  - _self_
name: {HEAD}
drafter:
  _target_: methods.{HEAD}.drafter.NextNextDrafter
  checkpoint: null
'''
HEAD_MODEL_CONFIG = f'''# @package method
drafter:
  checkpoint: artifacts/{HEAD}/smollm2_135m
'''
HEAD_TRAIN_CONFIG = f'''# A throwaway method's training (tests/test_new_method.py).
recipe:
  _target_: methods.{HEAD}.train.NextNextRecipe
draft_vocab_size: 8192
lr: 1.0e-3
betas: [0.9, 0.999]
weight_decay: 0.0
warmup_steps: 1
grad_clip: 1.0
batch_size: 8
max_steps: 4
minutes: 5
max_minutes: null
dtype: auto
eval_every: 1000
checkpoint_minutes: 2
resume: false
checkpoint: ${{oc.env:SPECBENCH_CACHE,'~/.cache/specbench'}}/train/${{model.name}}-{HEAD}.pt
out_dir: ${{method.drafter.checkpoint}}
'''
ADDED_WITH_HEAD = {**ADDED, f"methods/{HEAD}/__init__.py": "", f"methods/{HEAD}/drafter.py": HEAD_DRAFTER,
                   f"methods/{HEAD}/train.py": HEAD_RECIPE, f"conf/method/{HEAD}.yaml": HEAD_CONFIG,
                   f"conf/method_model/{HEAD}/smollm2_135m.yaml": HEAD_MODEL_CONFIG,
                   f"conf/train/{HEAD}.yaml": HEAD_TRAIN_CONFIG,
                   f"bench/parity/methods/{HEAD}.py": PARITY.replace(NAME, HEAD)}


def project_copy(root: Path, added: dict[str, str]) -> Path:
    """A copy of the project's code and configs at `root` with `added` written, and nothing else changed."""
    for folder in COPIED:
        shutil.copytree(PROJECT_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in added.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the project's code and configs with the throwaway method added, and nothing else changed."""
    return project_copy(tmp_path / "project", ADDED)


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


@pytest.mark.real_model
def test_a_new_method_with_weights_trains_them_and_drafts_with_them(tmp_path):
    """A method with a head: its recipe beside its drafter, its training settings in conf/train/, its checkpoint's
    place for the model in conf/method_model/. `python -m bench.train` trains it (a few steps on a small feature
    cache) into a checkpoint with its card, and `python -m bench` drafts with that checkpoint, lossless."""
    root = project_copy(tmp_path / "project", ADDED_WITH_HEAD)
    head, run = tmp_path / "head", tmp_path / "run"
    subprocess.run([sys.executable, "-m", "bench.train", f"method={HEAD}", f"method.drafter.checkpoint={head}",
                    f"features.dir={tmp_path / 'features'}", "features.num_sequences=64", "features.seq_len=64",
                    f"train.checkpoint={tmp_path / 'resume.pt'}"], cwd=root, check=True, capture_output=True,
                   text=True)
    card = json.loads((head / "card.json").read_text())
    assert card["steps"] == 4 and (head / "model.safetensors").is_file()
    subprocess.run([sys.executable, "-m", "bench", f"method={HEAD}", "model=smollm2_135m", "task=mt_bench",
                    "task.limit=1", "gen.max_new_tokens=16", f"method.drafter.checkpoint={head}", f"out_dir={run}"],
                   cwd=root, check=True, capture_output=True, text=True)
    [answer] = [json.loads(line) for line in (run / "answers.jsonl").read_text().splitlines()]
    assert answer["exact_match"] is True and answer["method"] == HEAD
    assert changed_files(root) == set(ADDED_WITH_HEAD)
