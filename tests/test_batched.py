"""The batched engine (bench/engine/batched.py) is lossless at any batch size: every row's tokens, and its accepted
tokens per step, are what batch-1 decoding of its prompt gives, for every method's drafter."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from bench.engine.batched import BatchedEngine
from bench.engine.drafter import Drafter
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.engine.tree import DraftTree
from bench.errors import ConfigError
from bench.measure.run import run
from bench.planning.costmodel import Profile
from bench.planning.policy import SpeculationPlanner
from bench.validate import validate
from methods.dflash.drafter import DFlashDrafter
from methods.eagle.dynamic import Eagle2Drafter
from methods.eagle.static import Eagle1Drafter
from methods.hydra.drafter import HydraDrafter
from methods.lookahead import LookaheadDrafter
from methods.medusa.drafter import MedusaDrafter
from methods.mlp_speculator.drafter import MLPSpeculatorDrafter
from methods.pard.drafter import tiny_drafter as pard_tiny_drafter
from methods.pld import PromptLookupDrafter
from methods.redrafter.drafter import ReDrafterDrafter
from methods.rest import RestDrafter
from methods.rest_datastore import write_datastore
from methods.sps.drafter import DraftModelDrafter
from tests.conftest import VOCAB, assert_acceptance_records_match, folder_stem, generate_tokens, vanilla_tokens

LENGTHS = (5, 17, 40, 9, 23)  # prompts of different lengths: the batch cache has holes from the start


@pytest.fixture(scope="module")
def batch_prompts():
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in LENGTHS]


class ScriptedByPrompt(Drafter):
    """Proposes from each prompt's known vanilla continuation; how right depends on the prompt (`modes`, by prompt
    length), so rows accept different numbers of tokens each step. State is set in start(), as a forked drafter's
    must be."""

    def __init__(self, references: dict[tuple, list[int]], modes: dict[int, str], width: int = 4):
        self.references, self.modes, self.width = references, modes, width

    def start(self, prompt_ids):
        self.prompt = tuple(prompt_ids)

    def propose(self, context, max_tokens):
        done = len(context) - len(self.prompt)
        truth = self.references[self.prompt][done : done + self.width]
        wrong = [(t + 1) % VOCAB for t in truth]
        mode = self.modes[len(self.prompt) % len(self.modes)]
        if not truth or mode == "none":
            return None
        if mode == "right":
            return DraftTree.chain(truth)
        if mode == "half":
            return DraftTree.chain(truth[:2] + wrong[2:])
        if mode == "alternate":  # right on every other step, rows out of phase: the longest row changes
            return DraftTree.chain(truth if (done // 2 + len(self.prompt)) % 2 else wrong)
        tokens, parents = [wrong[0]] + truth, [-1, -1] + list(range(1, len(truth)))  # "tree": a wrong branch first
        return DraftTree(tokens, parents)

    def update(self, step):
        pass


def method_drafters(model, tmp_path, prompts):
    """One drafter per method, on the tiny model (random heads and draft: right sometimes, wrong mostly; REST's
    datastore holds the prompts' own continuations, so it is right often)."""
    from methods.recycling import RecyclingDrafter
    from methods.samd import SamdDrafter
    from methods.sps.draft import slice_target
    from methods.suffix_decoding import SuffixDecodingDrafter
    from tests.test_dflash import random_module as random_dflash
    from tests.test_eagle import random_head
    from tests.test_hydra import random_heads as hydra_heads
    from tests.test_medusa import random_heads as medusa_heads
    from tests.test_mlp_speculator import random_stages
    from tests.test_redrafter import random_drafter

    store = write_datastore(tmp_path / "toy.idx", [p + vanilla_tokens(model, p, 24) for p in prompts], sort_depth=4)
    return {
        "pld": lambda: PromptLookupDrafter(model),
        "lookahead": lambda: LookaheadDrafter(window_size=4, ngram_size=4, guess_set_size=2),
        "rest": lambda: RestDrafter(datastore={"path": str(store)}, num_draft=64, draft_length=3),
        "sps": lambda: DraftModelDrafter(model, draft_model=slice_target(model, [0]), num_draft_tokens=4),
        "medusa": lambda: MedusaDrafter(model, choices="mc_sim_7b_63", tree_size=16, heads=medusa_heads(64)),
        "hydra": lambda: HydraDrafter(model, choices="mc_sim_7b_63", tree_size=16, heads=hydra_heads()),
        "mlp_speculator": lambda: MLPSpeculatorDrafter(model, heads=random_stages()),
        "pard": lambda: pard_tiny_drafter(model, SamplingConfig(), {"num_draft_tokens": 4}, tmp_path),
        "dflash": lambda: DFlashDrafter(model, drafter=random_dflash(model)),
        "redrafter": lambda: ReDrafterDrafter(model, beam_width=4, beam_length=4, heads=random_drafter(model)),
        "eagle": lambda: Eagle1Drafter(model, head=random_head(model, 3), choices="eagle_7b_25"),
        "eagle2": lambda: Eagle2Drafter(model, head=random_head(model, 3), total_token=10, depth=4, top_k=3),
        "recycling": lambda: RecyclingDrafter(model, carry_over=False),  # a carried matrix is shared by the rows
        "samd": lambda: SamdDrafter(model, eagle2={"head": random_head(model, 3), "total_token": 10, "depth": 4,
                                                   "top_k": 3}),
        "suffix": lambda: SuffixDecodingDrafter(model, carry_over=False),  # a carried global tree: shared by the rows
    }


def assert_batch_equals_batch_one(model, make_drafter, prompts, max_new_tokens: int, eos=frozenset(),
                                  compiled: bool = False, engine: BatchedEngine | None = None):
    """Every row of one batch (of `engine`, else a new one, compiled or not) equals eager batch-1 decoding of its
    prompt (tokens and accepted tokens per step) and transformers' generate; returns the batch output."""
    stop = StopCondition(max_new_tokens, eos)
    engine = engine or BatchedEngine(model, make_drafter(), compile=compiled)
    batch = engine.generate(prompts, stop, [0] * len(prompts))
    single = SpeculativeEngine(model, make_drafter())
    for prompt, row in zip(prompts, batch.turns):
        alone = single.generate(prompt, stop)
        assert row.tokens == alone.tokens == generate_tokens(model, prompt, max_new_tokens, eos)
        assert row.accept_lengths == alone.accept_lengths
        assert row.verified_tokens == alone.verified_tokens
    return batch


def test_vanilla_batch_equals_generate_with_rows_leaving_early(tiny_model, batch_prompts, one_thread):
    eos = frozenset({vanilla_tokens(tiny_model, batch_prompts[1], 30)[6]})  # row 1 (at least) stops early
    out = assert_batch_equals_batch_one(tiny_model, lambda: None, batch_prompts, 30, eos)
    assert min(len(t.tokens) for t in out.turns) < 30 == max(len(t.tokens) for t in out.turns)
    # the early row's latency ends with it: marks of one monotonic clock, decode steps between them (load only widens)
    assert out.finish_seconds[1] < max(out.finish_seconds)


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_scripted_drafts_accepting_different_amounts_per_row(tiny_model, batch_prompts, batch_size, one_thread):
    """Rows accepting 0..4 drafts a step from chains and trees: the cache grows holes, is compacted, rows leave."""
    references = {tuple(p): vanilla_tokens(tiny_model, p, 40) for p in batch_prompts}
    modes = {0: "right", 1: "tree", 2: "half", 3: "none"}
    make = lambda: ScriptedByPrompt(references, modes)  # noqa: E731
    out = assert_batch_equals_batch_one(tiny_model, make, batch_prompts[:batch_size], 40)
    assert max(max(t.accept_lengths) for t in out.turns) == 5  # whole chains were accepted somewhere


def test_cache_compaction_when_holes_build_up(tiny_model, batch_prompts, monkeypatch, one_thread):
    """Rows that take turns accepting whole chains leave holes behind the longest row; compacting them away
    (more than once, with no row leaving) keeps every row's output."""
    from bench.engine.batched import BatchCache

    compactions = []
    original = BatchCache.compact
    monkeypatch.setattr(BatchCache, "compact", lambda self, rows: (compactions.append(len(rows)), original(self, rows)))
    references = {tuple(p): vanilla_tokens(tiny_model, p, 80) for p in batch_prompts}
    make = lambda: ScriptedByPrompt(references, {0: "alternate"})  # noqa: E731
    assert_batch_equals_batch_one(tiny_model, make, batch_prompts, 80)
    assert compactions.count(len(batch_prompts)) >= 2  # compactions of the full batch: holes, not departures


def test_windowed_models_mask_each_row_by_its_own_positions(windowed_model, batch_prompts, one_thread):
    references = {tuple(p): vanilla_tokens(windowed_model, p, 30) for p in batch_prompts}
    make = lambda: ScriptedByPrompt(references, {0: "tree", 1: "right", 2: "half"})  # noqa: E731
    assert_batch_equals_batch_one(windowed_model, make, batch_prompts, 30)


@pytest.mark.parametrize("method", ["pld", "lookahead", "rest", "sps", "medusa", "hydra", "eagle", "eagle2",
                                    "recycling", "samd", "suffix", "mlp_speculator", "pard", "dflash",
                                    "redrafter"])
def test_every_method_is_lossless_batched(tiny_model, batch_prompts, tmp_path, method, one_thread):
    make = method_drafters(tiny_model, tmp_path, batch_prompts[:4])[method]
    out = assert_batch_equals_batch_one(tiny_model, make, batch_prompts[:4], 24)
    assert any(n > 1 for t in out.turns for n in t.verified_tokens)  # drafts were verified


def test_compiled_batch_equals_batch_one_with_rows_leaving_early(tiny_model, batch_prompts, one_thread):
    """engine.compile=on at batch 5: vanilla's rows, one ending early on EOS, equal eager batch 1 and generate; the
    batch keeps its rows (a finished one becomes a spare row), so one graph serves every step."""
    from bench.engine.batched_compiled import StaticBatchCache

    eos = frozenset({vanilla_tokens(tiny_model, batch_prompts[1], 30)[6]})
    engine = BatchedEngine(tiny_model, compile=True)
    out = assert_batch_equals_batch_one(tiny_model, lambda: None, batch_prompts, 30, eos, engine=engine)
    assert min(len(t.tokens) for t in out.turns) < 30 == max(len(t.tokens) for t in out.turns)
    assert isinstance(engine.compiled, StaticBatchCache) and engine.compiled.rows == len(batch_prompts)
    # a later batch of fewer prompts runs in the same rows (two spare from the start): the same reserved cache
    capacity = engine.compiled.capacity
    assert_batch_equals_batch_one(tiny_model, lambda: None, batch_prompts[2:], 30, engine=engine)
    assert (engine.compiled.rows, engine.compiled.capacity) == (len(batch_prompts), capacity)


def test_compiled_batch_compacts_holes_in_place(tiny_model, batch_prompts, monkeypatch, one_thread):
    """Scripted rows accepting different amounts (chains, a tree, none) and taking turns at whole chains: the
    compiled batch's holes are compacted in place, more than once, and every row equals batch 1."""
    from bench.engine.batched_compiled import StaticBatchCache

    compactions = []
    original = StaticBatchCache.compact
    monkeypatch.setattr(StaticBatchCache, "compact", lambda self: (compactions.append(self.slots), original(self)))
    references = {tuple(p): vanilla_tokens(tiny_model, p, 80) for p in batch_prompts}
    for modes in ({0: "right", 1: "tree", 2: "half", 3: "none"}, {0: "alternate"}):
        make = lambda: ScriptedByPrompt(references, modes)  # noqa: E731
        assert_batch_equals_batch_one(tiny_model, make, batch_prompts, 80, compiled=True)
    assert len(compactions) >= 2


@pytest.mark.parametrize("method", ["eagle2", "medusa"])
def test_methods_are_lossless_in_a_compiled_batch(tiny_model, batch_prompts, tmp_path, method, one_thread):
    """A head that reads the target's features (EAGLE-2's dynamic trees) and a static tree (Medusa's) verified by
    the compiled batch: every row equals eager batch 1."""
    make = method_drafters(tiny_model, tmp_path, batch_prompts[:4])[method]
    out = assert_batch_equals_batch_one(tiny_model, make, batch_prompts[:4], 24, compiled=True)
    assert any(n > 1 for t in out.turns for n in t.verified_tokens)


def test_a_windowed_model_runs_the_batch_eager_and_says_so(windowed_model, batch_prompts, capsys, one_thread):
    engine = BatchedEngine(windowed_model, compile=True)
    assert engine.compiled is None
    assert "the batched engine runs eager" in capsys.readouterr().err
    assert_batch_equals_batch_one(windowed_model, lambda: None, batch_prompts[:2], 8, engine=engine)


@pytest.mark.parametrize("drafter, compiled", [(None, False), ("pld", False), (None, True), ("pld", True)])
def test_sampled_rows_equal_batch_one_with_the_same_seeds(tiny_model, batch_prompts, drafter, compiled, one_thread):
    """Under sampling each row draws from its own generator, seeded as at batch 1: with a deterministic drafter
    (or none) every row's tokens and accepted tokens per step are eager batch 1's for the same seed, in the eager
    batch and in the compiled one."""
    sampling = SamplingConfig(temperature=1.0)
    stop = StopCondition(20)
    seeds = [11, 12, 13]
    make = (lambda: None) if drafter is None else (lambda: PromptLookupDrafter(tiny_model, max_ngram_size=1))
    engine = BatchedEngine(tiny_model, make(), sampling, compile=compiled)
    assert (engine.compiled is not None) == compiled
    out = engine.generate(batch_prompts[:3], stop, seeds)
    single = SpeculativeEngine(tiny_model, make(), sampling)
    alone = [single.generate(p, stop, seed=s) for p, s in zip(batch_prompts[:3], seeds)]
    assert [t.tokens for t in out.turns] == [a.tokens for a in alone]
    assert [t.accept_lengths for t in out.turns] == [a.accept_lengths for a in alone]


def linear_profile(per_token: float) -> Profile:
    """t(L) = 1 + per_token x (L - 1), the same at every context."""
    lengths = [1, 2, 4, 8, 16, 32, 64]
    row = [1.0 + per_token * (n - 1) for n in lengths]
    return Profile({}, lengths, [0, 100000], [row, row])


@pytest.mark.parametrize("per_token, drafts", [(10.0, False), (0.0, True)])
def test_planned_sizing_rests_or_drafts_as_the_profile_says(tiny_model, batch_prompts, per_token, drafts, one_thread):
    """Verification 10x a plain step per extra token: after the warm-up only probes draft. Free verification: every
    step drafts. Lossless either way."""
    references = {tuple(p): vanilla_tokens(tiny_model, p, 40) for p in batch_prompts}
    planner = SpeculationPlanner(linear_profile(per_token), warmup_steps=2)
    engine = BatchedEngine(tiny_model, ScriptedByPrompt(references, {0: "right", 1: "half"}), planner=planner)
    out = engine.generate(batch_prompts, StopCondition(40), [0] * len(batch_prompts))
    assert [t.tokens for t in out.turns] == [references[tuple(p)] for p in batch_prompts]
    after_warmup = planner.plans[planner.warmup_steps:]
    rested = after_warmup.count(-1) / len(after_warmup)
    assert rested > 0.9 if not drafts else rested == 0


class FixedPlanner:
    """A planner that always asks for `k` nodes and verifies them (bench/engine/batched.py's StepPlanner)."""

    masked_steps = False

    def __init__(self, k: int):
        self.k, self.nodes_drafted = k, []

    def plan(self, context_len, rows=1):
        return self.k, True

    def drafted(self, seconds, full_trees=(), rows=1, trees=1, nodes=None):
        self.nodes_drafted.append(nodes)

    def cut(self, trees, context_len):
        return self.k

    def observe(self, tree, accepted_rows):
        pass


def test_planned_batches_draft_only_the_planned_nodes(tiny_model, batch_prompts, tmp_path, monkeypatch, one_thread):
    """Under a planner a drafter with partial drafts (EAGLE-2) is asked for the k nodes planned (propose_first, as
    at batch 1), never for its whole tree, and the planner learns what size was drafted; rows stay vanilla's."""
    asked, first = [], Eagle2Drafter.propose_first

    def spy(self, context, max_tokens, nodes):
        asked.append(nodes)
        return first(self, context, max_tokens, nodes)

    monkeypatch.setattr(Eagle2Drafter, "propose_first", spy)
    monkeypatch.setattr(Eagle2Drafter, "propose", lambda *_: pytest.fail("drafted a whole tree"))
    prompts, planner = batch_prompts[:3], FixedPlanner(2)
    out = BatchedEngine(tiny_model, method_drafters(tiny_model, tmp_path, prompts)["eagle2"](), planner=planner
                        ).generate(prompts, StopCondition(30), [0] * 3)
    assert [t.tokens for t in out.turns] == [vanilla_tokens(tiny_model, p, 30) for p in prompts]
    assert len(asked) >= len(planner.nodes_drafted) > 0 and set(asked) == set(planner.nodes_drafted) == {2}


@pytest.mark.parametrize("method", ["sps", "eagle2", "hydra", "lookahead"])
def test_drafters_updated_before_they_ever_propose(tiny_model, batch_prompts, tmp_path, method, one_thread):
    """A planner that rests from the first step (no warm-up, verification 10x a plain step) and probes now and then:
    each fork's first update comes before its first proposal, as in a run's later batches."""
    make = method_drafters(tiny_model, tmp_path, batch_prompts[:3])[method]
    planner = SpeculationPlanner(linear_profile(10.0), warmup_steps=0, probe_share=0.5)
    out = BatchedEngine(tiny_model, make(), planner=planner).generate(batch_prompts[:3], StopCondition(30), [0] * 3)
    assert planner.plans[0] == -1 and None in planner.plans  # rested first, probed later
    assert [t.tokens for t in out.turns] == [vanilla_tokens(tiny_model, p, 30) for p in batch_prompts[:3]]


def test_cli_batched_run_records_throughput_and_latency(compose, tmp_path):
    cfg = compose("method=pld", "task=qa", "task.limit=3", "gen.batch_size=2")
    summary = run(cfg)
    out = tmp_path / "run"
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    baselines = [json.loads(line) for line in (out / "baseline.jsonl").read_text().splitlines()]
    assert len(answers) == len(baselines) == 3 and all(a["exact_match"] for a in answers)
    rows = [a["choices"][0]["batch_rows"][0] for a in answers]
    assert rows == [2, 2, 1]  # questions decoded two at a time, the last alone
    first, second = (a["choices"][0] for a in answers[:2])
    # a question's tokens/s is its batch's throughput: both rows of a batch give the same
    rate = [sum(c["new_tokens"]) / sum(c["wall_time"]) for c in (first, second)]
    assert rate[0] == pytest.approx(rate[1], rel=1e-3)
    # the row that finished last waited the whole batch: its latency is the batch's wall time, from the same reads
    batch_wall = first["wall_time"][0] + second["wall_time"][0]
    assert max(first["latency"][0], second["latency"][0]) == pytest.approx(batch_wall, abs=1e-6)
    assert 0 < min(first["latency"][0], second["latency"][0]) <= batch_wall  # nested in the batch's reads
    assert summary.batch_size.tolist() == [2, 2] and summary.exact_match.iloc[-1] == 1.0
    assert (summary.mean_latency_s > 0).all() and (summary.baseline_mean_latency_s > 0).all()
    assert pd.read_csv(out / "summary.csv").batch_size.iloc[-1] == 2
    assert len(assert_acceptance_records_match(out)) == 3


def test_cli_compiled_batched_run(compose, tmp_path, capsys, one_thread):
    """engine.compile=on at gen.batch_size=2, end to end: both sides' graphs made before timing for rows of the batch,
    every answer vanilla's, meta.json says compiled."""
    summary = run(compose("method=pld", "task=qa", "task.limit=3", "gen.batch_size=2", "engine.compile=on"))
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["compiled"] and meta["compile_seconds"] > 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("engine.compile: the")]
    assert len(said) == 2 and all("for a cache of 2 rows of" in line for line in said)
    assert summary.exact_match.iloc[-1] == 1.0 and summary.batch_size.tolist() == [2, 2]


def test_row_latencies_end_at_the_batch_wall_time():
    from bench.measure.decoding import row_latencies

    # rows finished at 0.5, 1.5 and 1.0 s of the engine's timer, the batch timed at 2.0 s from outside
    assert row_latencies(2.0, [0.5, 1.5, 1.0]) == [1.0, 2.0, 1.5]


def test_batched_out_dir_and_labels(tiny_checkpoint, tmp_path):
    from bench.config import compose_config

    cfg = compose_config("method=pld", "gen.batch_size=4", "method.sizing=auto", "task=qa")
    assert folder_stem(cfg.out_dir).endswith("/pld+auto/qa-batch4")  # the same label as at batch 1
    assert folder_stem(compose_config("method=pld", "task=qa").out_dir).endswith("/pld/qa")
    with pytest.raises(ConfigError, match="method.batch_policy=adaptive: method=vanilla drafts nothing"):
        validate(compose_config("method=vanilla", "+method.batch_policy=adaptive"))
    with pytest.raises(ConfigError, match="gen.batch_size=0: must be an integer >= 1"):
        validate(compose_config("method=pld", "gen.batch_size=0"))


def test_cut_verifies_what_pays_for_the_rows_that_drafted():
    """t(L) = 1 + 0.5 (L - 1), no drafting time, nodes accepted with 0.9, 0.9, 0.1 (by hand: see the rates below)."""
    lengths = [1, 2, 3, 4]
    profile = Profile({}, lengths, [0, 1000], [[1.0 + 0.5 * (n - 1) for n in lengths]] * 2)
    planner = SpeculationPlanner(profile, prior=(0.0, 1e-9))
    planner.hits, planner.tries = [9.0, 9.0, 1.0], [10.0, 10.0, 10.0]
    chain = DraftTree.chain([1, 2, 3])
    # one row of four drafted: k=0 gives 4 tokens / 1 s; k=1 4.9 / 1.5 s; k=2 5.8 / 2 s; k=3 5.9 / 2.5 s
    assert planner.cut([chain, None, None, None], 10) == 0
    # all four drafted: k=1 7.6 / 1.5 = 5.07; k=2 11.2 / 2 = 5.6; k=3 11.6 / 2.5 = 4.64
    assert planner.cut([chain] * 4, 10) == 2
    # a batch of one: k=2 2.8 / 2 = 1.4 beats k=1 1.9 / 1.5 = 1.27 and plain 1 / 1
    assert planner.cut([chain], 10) == 2


@pytest.mark.real_model
def test_every_method_is_lossless_batched_on_smollm2(tmp_path):
    """SmolLM2 (float32) at batch 3, a long prompt beside two short ones: every row of every method equals its
    batch-1 vanilla tokens, or first differs where the target's top two logits tie (batched arithmetic rounds
    differently), as the runner's divergence check classifies it."""
    from bench.config import compose_config
    from bench.measure.exactness import find_divergence
    from bench.models import eos_token_ids
    from methods.rest_datastore import build
    from tests.conftest import load_smollm2, spec_bench_prompts
    from tests.method_checks import drafter_from_config, smollm2_vanilla

    model, tokenizer = load_smollm2()
    stop = StopCondition(32, frozenset(eos_token_ids(model, tokenizer)))
    prompts = spec_bench_prompts(tokenizer, "summarization", 1) + spec_bench_prompts(tokenizer, "qa", 2)
    store = f"datastore.path={tmp_path}/small.idx"
    build(compose_config("method=rest", "datastore.max_conversations=300", store))
    tie_margin = compose_config().model.tie_margin
    for method in ["vanilla", "pld", "lookahead", "rest", "sps", "medusa", "hydra", "eagle", "eagle2", "recycling",
                   "samd", "suffix", "mlp_speculator", "pard", "dflash", "redrafter"]:
        drafter = None if method == "vanilla" else drafter_from_config(method, model, tokenizer,
                                                                       *([store] if method == "rest" else []))
        out = BatchedEngine(model, drafter).generate(prompts, stop, [0] * len(prompts))
        for prompt, row in zip(prompts, out.turns):
            expected = smollm2_vanilla(tuple(prompt), 32)
            if row.tokens != expected:
                divergence = find_divergence(model, [{"token_ids": row.tokens, "prompt_ids": prompt}],
                                             {"choices": [{"token_ids": [expected]}]}, tie_margin)
                assert divergence["numeric_tie"], (method, divergence)
        if drafter is not None:
            assert any(n > 1 for t in out.turns for n in t.accept_lengths), method  # drafts were accepted
