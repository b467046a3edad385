"""Sampled runs repeat: a drafter's draws come from the turn's seed (bench/engine/loop.py's Drafter contract), so the
same seed gives the same tokens on a repeat, after other turns, in any question order and in any row of a batch."""
from __future__ import annotations

import pytest
import torch

import bench.measure.run
from bench.engine.batched import BatchedEngine
from bench.engine.drafter import Drafter, drafter_seed
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.run import run
from bench.records import read_jsonl
from methods.eagle.dynamic import Eagle2Drafter
from methods.eagle.static import Eagle1Drafter
from methods.eagle3.drafter import Eagle3Drafter
from methods.sps.draft import slice_target
from methods.sps.drafter import DraftModelDrafter
from tests.test_eagle import random_head
from tests.test_eagle3 import random_eagle3_head

T1 = SamplingConfig(temperature=1.0)
SAMPLING_DRAFTERS = {  # drafters that draw random numbers under sampling
    "sps": lambda m: DraftModelDrafter(m, draft_model=slice_target(m, [0]), num_draft_tokens=4, sampling=T1, seed=0),
    "eagle": lambda m: Eagle1Drafter(m, head=random_head(m, 3), choices="eagle_7b_25", sampling=T1, seed=0),
    "eagle2": lambda m: Eagle2Drafter(m, head=random_head(m, 3), total_token=10, depth=4, top_k=3, sampling=T1,
                                     seed=0),
    "eagle3": lambda m: Eagle3Drafter(m, head=random_eagle3_head(m, 3, std=0.3), total_token=10, depth=4, top_k=3,
                                      sampling=T1, seed=0),
}


def test_drafter_seeds_are_derived_apart_from_the_acceptance_stream():
    seeds = [drafter_seed(s) for s in range(100)]
    assert seeds == [drafter_seed(s) for s in range(100)]  # a function of the seed alone
    assert len(set(seeds) | set(range(100))) == 200  # never a turn's own seed, nor another turn's
    assert all(0 <= s < 2**63 for s in seeds) and drafter_seed(None) is None


@pytest.mark.parametrize("method", sorted(SAMPLING_DRAFTERS))
def test_same_seed_same_tokens_whatever_came_before(tiny_model, prompts, method, one_thread):
    """A repeat, a repeat after other seeds and prompts, and a fresh engine all give the first run's tokens; other
    seeds give other tokens (the draws do depend on the seed)."""
    engine = SpeculativeEngine(tiny_model, SAMPLING_DRAFTERS[method](tiny_model), T1)
    stop = StopCondition(24)
    first = engine.generate(prompts[1], stop, seed=5)
    assert engine.generate(prompts[1], stop, seed=5).tokens == first.tokens
    others = [engine.generate(p, stop, seed=s).tokens for s, p in [(6, prompts[1]), (7, prompts[0]), (8, prompts[1])]]
    again = engine.generate(prompts[1], stop, seed=5)
    assert again.tokens == first.tokens and again.accept_lengths == first.accept_lengths
    fresh = SpeculativeEngine(tiny_model, SAMPLING_DRAFTERS[method](tiny_model), T1).generate(prompts[1], stop, seed=5)
    assert fresh.tokens == first.tokens
    assert others[0] != first.tokens and others[2] != first.tokens


@pytest.mark.parametrize("method", sorted(SAMPLING_DRAFTERS))
def test_batched_rows_draw_from_their_own_seeds(tiny_model, prompts, method, one_thread):
    """Each row's drafter is started with its own row's seed: reordering the batch reorders the rows' tokens, and a
    row alone in a batch decodes as it did among the others."""
    engine = BatchedEngine(tiny_model, SAMPLING_DRAFTERS[method](tiny_model), T1)
    stop = StopCondition(20)
    seeds = [21, 22, 23]
    out = [t.tokens for t in engine.generate(prompts, stop, seeds).turns]
    reordered = [t.tokens for t in engine.generate(prompts[::-1], stop, seeds[::-1]).turns]
    assert reordered == out[::-1]
    alone = engine.generate([prompts[1]], stop, [seeds[1]]).turns[0].tokens
    assert alone == out[1] and len({tuple(t) for t in out}) == 3


@pytest.fixture(scope="module")
def tiny_artifacts(tiny_checkpoint, tmp_path_factory):
    """An SpS draft (one layer of the tiny checkpoint), random heads and a datastore for it, saved as runs load them:
    each method's overrides pointing at them."""
    from transformers import AutoModelForCausalLM

    from methods.heads.common import save_heads
    from methods.hydra.heads import HydraHeads
    from methods.medusa.heads import MedusaHeads
    from methods.rest_datastore import write_datastore
    from methods.sps.draft import save_draft

    folder = tmp_path_factory.mktemp("artifacts")
    target = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float64)
    save_draft(slice_target(target, [0]), folder / "sps", {})
    save_heads(folder / "eagle", {"specbench_method": "eagle"}, random_head(target, 1).state_dict(), {})
    hidden = target.config.hidden_size
    for method, heads in (("medusa", MedusaHeads(hidden, 4)), ("hydra", HydraHeads(hidden, 4))):
        save_heads(folder / method, {"specbench_method": method, "num_heads": 4, "num_layers": 1},
                   heads.state_dict(), {})
    generator = torch.Generator().manual_seed(4)
    corpus = [torch.randint(0, target.config.vocab_size, (40,), generator=generator).tolist() for _ in range(20)]
    write_datastore(folder / "rest.idx", corpus, sort_depth=8)
    heads = {method: [f"method.drafter.checkpoint={folder / method}"] for method in ("medusa", "hydra")}
    eagle = f"method.drafter.checkpoint={folder / 'eagle'}"
    return {**heads, "sps": [f"method.drafter.draft_path={folder / 'sps'}"], "eagle": [eagle],
            "samd": [f"method.drafter.eagle2.checkpoint={folder / 'eagle'}"],
            "eagle2": [eagle, "method.drafter.total_token=8", "method.drafter.depth=3", "method.drafter.top_k=2"],
            "rest": [f"++datastore.path={folder / 'rest.idx'}"]}


def tokens_by_question(path) -> dict:
    return {a["question_id"]: a["choices"][0]["token_ids"] for a in read_jsonl(path)}


@pytest.mark.parametrize("method", ["sps", "eagle", "eagle2", "medusa", "hydra", "pld", "lookahead", "rest",
                                    "recycling", "samd", "suffix", "vanilla"])
def test_sampled_runs_with_repeats_succeed(compose, tiny_artifacts, tmp_path, method, one_thread):
    """repeats=3 under sampling: every repeat of a turn gives the same tokens (else RepeatMismatchError)."""
    summary = run(compose(f"method={method}", "task=mt_bench", "task.limit=2", "repeats=3", "gen.temperature=1",
                          *tiny_artifacts.get(method, [])))
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    assert len(answers) == 2 and all(len(t) == 3 for a in answers for t in a["choices"][0]["wall_times"])
    assert summary.n_questions.iloc[-1] == 2


@pytest.mark.parametrize("method", ["sps", "eagle"])
def test_question_order_does_not_change_sampled_tokens(compose, tiny_artifacts, tmp_path, monkeypatch, method,
                                                       one_thread):
    """A run over the questions in reverse order gives each question (method and vanilla alike) the same tokens."""
    settings = (f"method={method}", "task=qa", "task.limit=3", "gen.temperature=1", *tiny_artifacts[method])
    run(compose(*settings, f"out_dir={tmp_path / 'forward'}"))
    load_questions = bench.measure.run.load_questions
    monkeypatch.setattr(bench.measure.run, "load_questions", lambda task: load_questions(task)[::-1])
    run(compose(*settings, f"out_dir={tmp_path / 'reversed'}"))
    for name in ("answers.jsonl", "baseline.jsonl"):
        forward = tokens_by_question(tmp_path / "forward" / name)
        backward = tokens_by_question(tmp_path / "reversed" / name)
        assert list(backward) == list(forward)[::-1] and backward == forward


class SeedRecorder(Drafter):
    """A drafter that proposes nothing and records the seed each start() got."""

    samples = True  # declares that it draws random numbers: start() gets the turn's drafter seed

    def __init__(self):
        self.seeds = []

    def start(self, prompt_ids, seed=None):
        self.seeds.append(seed)

    def propose(self, context, max_tokens):
        return None

    def update(self, step):
        pass


def test_engines_hand_each_turn_and_row_its_drafter_seed(tiny_model, prompts):
    from bench.planning.policy import PlannedDrafter
    from tests.test_costmodel import linear_profile

    recorder = SeedRecorder()
    engine = SpeculativeEngine(tiny_model, PlannedDrafter(recorder, linear_profile(), tiny_model.device), T1)
    engine.generate(prompts[0], StopCondition(2), seed=5)
    engine.generate(prompts[0], StopCondition(2))
    assert recorder.seeds == [drafter_seed(5), None]
    recorder.seeds.clear()
    BatchedEngine(tiny_model, recorder, T1).generate(prompts, StopCondition(2), [7, 8, 9])
    assert recorder.seeds == [drafter_seed(7), drafter_seed(8), drafter_seed(9)]  # forks share the list
