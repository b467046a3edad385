"""The cost model (bench/planning/costmodel.py, profile.py, policy.py): profiles, phase times, predicted speedup,
method.sizing=auto."""
from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from bench.engine.drafter import Drafter
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.tree import DraftTree, first_nodes
from bench.measure.run import run
from bench.planning.costmodel import (
    Profile,
    ProfileError,
    best_size,
    device_slug,
    predicted_seconds,
    predicted_speedup,
    profile_path,
    turn_contexts,
)
from bench.planning.policy import PlannedDrafter, SpeculationPlanner
from bench.planning.profile import BLAS_ENVIRONMENT, measure_forward_times, profile_command, profile_setting
from bench.records import PHASES, read_jsonl
from methods.medusa.drafter import MedusaDrafter
from methods.medusa.heads import MedusaHeads
from methods.pld import PromptLookupDrafter
from tests.conftest import VOCAB, folder_stem, vanilla_tokens

SETTING = {"model": "tiny", "path": "x", "gguf_file": None, "dtype": "float64", "attn_implementation": None,
           "device": "cpu", "device_name": "test cpu", "threads": 2, "torch": "2.13.0"}
BASE, PER_TOKEN = 0.02, 0.005  # the fake model's forward takes BASE + PER_TOKEN x L seconds on the fake clock
TREE_MASK = 0.003  # and TREE_MASK more when it is given a 4-D (tree) mask
DRAFT = 0.001  # NoisyOracle's proposals take this long on the fake clock


def linear_profile(base: float = BASE, per_token: float = PER_TOKEN) -> Profile:
    lengths, contexts = [1, 2, 4, 8, 16], [16, 256]
    return Profile(SETTING, lengths, contexts, [[base + per_token * n for n in lengths] for _ in contexts])


def test_profile_round_trips_and_is_refused_for_another_setting(tmp_path):
    profile = linear_profile()
    path = profile_path(tmp_path, SETTING)
    assert path.name == "tiny-cpu2t-float64-test-cpu.json"
    gpu = {**SETTING, "device": "cuda", "threads": None, "device_name": "NVIDIA H200", "batch": 4}
    assert profile_path(tmp_path, gpu).name == "tiny-cuda-float64-b4-nvidia-h200.json"
    assert device_slug("Intel(R) Xeon(R) Processor") == "intel-xeon-processor"
    cbwr = {**SETTING, "blas": {"MKL_CBWR": "AVX2"}}
    assert profile_path(tmp_path, cbwr).name == "tiny-cpu2t-float64-test-cpu-mkl_cbwr_avx2.json"
    profile.save(path)
    assert Profile.load(path, SETTING, "make it") == profile
    with pytest.raises(ProfileError, match=r"another setting \(threads differ\).*make it profile.force=true"):
        Profile.load(path, {**SETTING, "threads": 1}, "make it")
    with pytest.raises(ProfileError, match="no forward-time profile.*make it"):
        Profile.load(tmp_path / "none.json", SETTING, "make it")


def test_transformers_version_does_not_key_the_profile(tmp_path, monkeypatch):
    """A fresh install gets the newest transformers patch release: the committed profile must still serve it, so
    the key leaves transformers out, and a profile stored with the retired key still loads."""
    import transformers

    model_cfg = OmegaConf.create({"name": "tiny", "path": "x", "dtype": "float32"})
    before = profile_setting(model_cfg, torch.device("cpu"), threads=2)
    monkeypatch.setattr(transformers, "__version__", "5.99.0")
    assert profile_setting(model_cfg, torch.device("cpu"), threads=2) == before
    assert "transformers" not in before and before["torch"] == torch.__version__
    path = profile_path(tmp_path, SETTING)
    old = linear_profile()
    old.setting = {**SETTING, "transformers": "5.24.0"}
    old.save(path)
    assert Profile.load(path, SETTING, "make it").seconds == old.seconds
    with pytest.raises(ProfileError, match=r"\(torch differ\)"):
        Profile.load(path, {**SETTING, "torch": "2.14.0"}, "make it")


def test_blas_code_path_variables_key_the_profile_and_its_command(monkeypatch):
    """MKL_CBWR changes MKL's code path (and forward times) on AMD CPUs: a run under it needs its own profile."""
    model_cfg = OmegaConf.create({"name": "tiny", "path": "x", "dtype": "float32"})
    cpu = torch.device("cpu")
    for name in BLAS_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    plain = profile_setting(model_cfg, cpu, threads=2)
    assert "blas" not in plain
    assert profile_command("tiny", cpu, 2) == ("OMP_NUM_THREADS=2 python -m bench.profile model=tiny device=cpu "
                                               "engine.compile=off")
    assert profile_command("tiny", cpu, 2, compiled=True).endswith("device=cpu engine.compile=on")
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    cbwr = profile_setting(model_cfg, cpu, threads=2)
    assert cbwr == {**plain, "blas": {"MKL_CBWR": "AVX2"}}
    assert profile_command("tiny", cpu, 2).startswith("MKL_CBWR=AVX2 OMP_NUM_THREADS=2 python -m bench.profile")


def test_profile_interpolates_between_measured_points():
    profile = Profile(SETTING, [1, 4], [100, 300], [[1.0, 4.0], [3.0, 12.0]])
    assert profile.forward_seconds(1, 100) == 1.0
    assert profile.forward_seconds(2, 100) == 2.0  # linear in L
    assert profile.forward_seconds(2.5, 200) == pytest.approx((2.5 + 7.5) / 2)  # and in context
    assert profile.forward_seconds(64, 1000) == 12.0  # clamped
    assert profile.relative() == [1.0, 4.0]


def test_best_size_maximises_tokens_per_second():
    profile = linear_profile()
    probs = [0.9, 0.6, 0.3, 0.1]
    rates = [(1 + sum(probs[:k])) / (BASE + PER_TOKEN * (1 + k)) for k in range(5)]
    k, rate = best_size(probs, 100, profile)
    assert k == max(range(5), key=rates.__getitem__) and rate == pytest.approx(max(rates))
    assert best_size([0.01, 0.01], 100, profile)[0] == 0  # nothing pays
    assert best_size(probs, 100, profile, draft_seconds=1.0)[0] == 4  # drafting cost is paid whatever k is


def test_best_size_prices_drafting_per_size():
    """Verification nearly free (bfloat16's regime): one drafting cost for every k lets the whole tree win; drafting
    priced per size (a third node needing a level more) keeps the tree at two nodes."""
    profile, probs = linear_profile(BASE, 0.0), [0.9, 0.6, 0.3, 0.1]
    assert best_size(probs, 100, profile, draft_seconds=0.01)[0] == 4
    assert best_size(probs, 100, profile, draft_seconds=[0.0, 0.002, 0.004, 0.05, 0.06])[0] == 2


@pytest.mark.parametrize("partial", [False, True])
def test_the_planner_prices_drafting_per_size_asked_for_partial_drafts(partial):
    """A drafter that drafts only the nodes asked for (partial_drafts) is priced by the means measured per size
    asked (the probe's: the whole tree's), linear between them; any other by the mean of every drafted step."""
    planner = SpeculationPlanner(linear_profile(), partial_drafts=partial)
    planner.drafted(0.04, [DraftTree([1, 2, 3, 4], [-1, 0, 1, 2])])  # a probe: the whole tree, 4 nodes
    planner.drafted(0.01, nodes=2)
    expected = [0.01, 0.01, 0.01, 0.025, 0.04] if partial else [0.025] * 5
    assert planner.drafting_seconds() == pytest.approx(expected)


def test_turn_contexts_follow_the_accepted_tokens():
    assert turn_contexts(10, [3, 1, 2]) == [10, 13, 14]  # the root of each step (the prefill's token first) is not
    # cached yet


class FakeClock:
    """Seconds that pass only when something says they do: the fake model's forwards, the fake drafter."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def slowed(model, clock: FakeClock, base: float = BASE, per_token: float = PER_TOKEN):
    """The model with a forward that also advances `clock` by base + per_token x L seconds (L: input tokens), plus
    TREE_MASK when it gets a 4-D attention mask."""
    forward = model.forward

    def slow_forward(*args, **kwargs):
        mask = kwargs.get("attention_mask")
        clock.advance(base + per_token * kwargs["input_ids"].shape[1] + (TREE_MASK if mask is not None else 0.0))
        return forward(*args, **kwargs)

    model.forward = slow_forward
    return model


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def slow_model(clock):
    from tests.conftest import make_tiny_model

    return slowed(make_tiny_model(seed=4), clock)


class NoisyOracle(Drafter):
    """Proposes a chain whose i-th token is vanilla's with probability q[i] (q: one number for every position),
    stopping at the first miss (a wrong token there): node i is accepted with probability q[0] x ... x q[i]."""

    def __init__(self, continuations: dict[tuple, list[int]], width: int, q, seed: int = 0,
                 clock: FakeClock | None = None):
        self.continuations, self.width, self.rng = continuations, width, random.Random(seed)
        self.q = q if isinstance(q, list) else [q] * width
        self.clock = clock  # advanced by DRAFT per proposal

    def start(self, prompt_ids):
        self.prompt = tuple(prompt_ids)

    def propose(self, context, max_tokens):
        if self.clock is not None:
            self.clock.advance(DRAFT)
        truth = self.continuations[self.prompt][len(context) - len(self.prompt):]
        chain = []
        for i, token in enumerate(truth[: min(self.width, max_tokens - 1)]):
            if self.rng.random() < self.q[i]:
                chain.append(token)
            else:
                chain.append((token + 1) % VOCAB)
                break
        return DraftTree.chain(chain) if chain else None

    def update(self, step):
        pass


def turn_record(out, wall: float, prompt: list[int]) -> dict:
    return {"choices": [{"decoding_steps": [out.decode_steps], "accept_lengths": out.accept_lengths,
                         "new_tokens": [len(out.tokens)], "wall_time": [wall], "phase_times": [out.phase_seconds],
                         "verified_tokens": [out.verified_tokens], "tree_steps": [out.tree_steps],
                         "prompt_tokens": [len(prompt)]}]}


def test_phase_times_add_up_and_the_profile_predicts_the_measured_speedup(slow_model, clock, prompts):
    """On a model whose forward costs BASE + PER_TOKEN x L (+ TREE_MASK with a tree mask) on a fake clock, the
    measured profile is that function, every turn's phase times are what its forwards and drafts cost and add up to
    its wall time, and the speedup predicted from the run's own steps is the measured one."""
    lengths, contexts = [1, 4, 8], [16, 64]
    seconds = measure_forward_times(slow_model, lengths, contexts, repeats=2, clock=clock)
    for chain, tree in zip(seconds["chain"], seconds["tree"]):
        assert chain == pytest.approx([BASE + PER_TOKEN * n for n in lengths], rel=1e-9)
        assert tree == pytest.approx([BASE + PER_TOKEN * n + TREE_MASK for n in lengths], rel=1e-9)
    profile = Profile(SETTING, lengths, contexts, seconds["chain"], tree_seconds=seconds["tree"])
    stop = StopCondition(24)
    continuations = {tuple(p): vanilla_tokens(slow_model, p, 24) for p in prompts}
    oracle = SpeculativeEngine(slow_model, NoisyOracle(continuations, width=6, q=0.7, clock=clock), clock=clock)
    plain = SpeculativeEngine(slow_model, clock=clock)
    method_records, vanilla_records = [], []
    for prompt in prompts:
        for engine, records in ((plain, vanilla_records), (oracle, method_records)):
            began = clock()
            out = engine.generate(prompt, stop)
            wall = clock() - began
            assert out.tokens == continuations[tuple(prompt)]
            assert len(out.verified_tokens) == out.decode_steps and not any(out.tree_steps)  # chains: no tree mask
            drafts = DRAFT * len(out.verified_tokens) if engine is oracle else 0.0
            assert out.phase_seconds == pytest.approx({
                "prefill": BASE + PER_TOKEN * len(prompt), "draft": drafts, "accept": 0.0,
                "verify": sum(BASE + PER_TOKEN * n for n in out.verified_tokens)}, rel=1e-9, abs=1e-12)
            assert sum(out.phase_seconds.values()) == pytest.approx(wall, rel=1e-9)
            records.append(turn_record(out, wall, prompt))
    speeds = [[sum(r["choices"][0]["new_tokens"]) / r["choices"][0]["wall_time"][0] for r in rs]
              for rs in (method_records, vanilla_records)]
    measured = statistics.mean(speeds[0]) / statistics.mean(speeds[1])
    assert measured > 1.2  # the oracle pays here
    assert predicted_speedup(method_records, profile) == pytest.approx(measured, rel=1e-9)
    assert predicted_speedup(vanilla_records, profile) == pytest.approx(1.0, rel=1e-9)


def test_tree_steps_are_predicted_from_the_tree_points(slow_model, clock, prompts):
    """Steps that pass a tree mask are marked and cost the profile's tree points: the prediction is the fake clock's
    time exactly, and would be TREE_MASK per step short from the chain points alone."""
    from methods.medusa.drafter import MedusaDrafter

    lengths, contexts = [1, 8, 32], [16, 64]
    seconds = measure_forward_times(slow_model, lengths, contexts, repeats=1, clock=clock)
    profile = Profile(SETTING, lengths, contexts, seconds["chain"], tree_seconds=seconds["tree"])
    chains_only = Profile(SETTING, lengths, contexts, seconds["chain"])
    torch.manual_seed(0)
    heads = MedusaHeads(64, 3).double()
    engine = SpeculativeEngine(slow_model, MedusaDrafter(slow_model, choices="mc_sim_7b_63", tree_size=20,
                                                         heads=heads), clock=clock)
    for prompt in prompts:
        began = clock()
        out = engine.generate(prompt, StopCondition(20))
        record = turn_record(out, clock() - began, prompt)
        masks = sum(out.tree_steps)
        assert masks >= len(out.verified_tokens) - 1 and out.phase_seconds["verify"] == pytest.approx(
            sum(BASE + PER_TOKEN * n for n in out.verified_tokens) + TREE_MASK * masks, rel=1e-9)
        method, _ = predicted_seconds(record, profile)
        assert method == pytest.approx(clock() - began, rel=1e-9)
        short, _ = predicted_seconds(record, chains_only)
        assert method - short == pytest.approx(TREE_MASK * masks, rel=1e-9)


def test_sizing_auto_picks_the_known_best_size(slow_model, clock, prompts):
    """With node i accepted with probability q[0] x ... x q[i] and a linear t(L), the best chain length is known
    (3 here, ~9% ahead of 2 and 4); after its warm-up, PlannedDrafter verifies that many tokens on most steps, and stays
    lossless."""
    q, width = [0.95] * 3 + [0.2] * 5, 8
    profile = linear_profile(BASE, BASE / 3)  # what the planner believes (it plans from the profile alone)
    truth = [1.0]
    for x in q:
        truth.append(truth[-1] * x)
    known_best, _ = best_size(truth[1:], 64, profile)
    assert known_best == 3
    continuations = {tuple(p): vanilla_tokens(slow_model, p, 60) for p in prompts}
    auto = PlannedDrafter(NoisyOracle(continuations, width, q, seed=1), profile, slow_model.device, probe_share=0.05,
                          clock=clock)
    engine = SpeculativeEngine(slow_model, auto)
    for prompt in prompts:
        assert engine.generate(prompt, StopCondition(60)).tokens == continuations[tuple(prompt)]
    planned = [k for k in auto.plans[auto.warmup_steps:] if k is not None]  # None: a probe
    assert statistics.mode(planned) == known_best and planned.count(known_best) > 0.7 * len(planned)


def test_sizing_auto_stops_drafting_when_nothing_pays(tiny_model, prompts, one_thread):
    """Verification that costs 20 x a single-token forward per extra token: no draft pays, so after the warm-up the
    drafter is not called, except for rare probes."""
    profile = Profile(SETTING, [1, 2], [16], [[0.001, 0.021]])
    calls = []

    class Counting(PromptLookupDrafter):
        def propose(self, context, max_tokens):
            calls.append(len(context))
            return super().propose(context, max_tokens)

    auto = PlannedDrafter(Counting(tiny_model), profile, tiny_model.device, warmup_steps=4)
    engine = SpeculativeEngine(tiny_model, auto)
    for prompt in prompts:
        assert engine.generate(prompt, StopCondition(40)).tokens == vanilla_tokens(tiny_model, prompt, 40)
    assert auto.plans.count(-1) > 0.9 * len(auto.plans) and len(calls) < 0.1 * len(auto.plans) + 4


def test_first_nodes_keep_a_tree_and_its_window():
    tree = DraftTree([5, 6, 7, 8], [-1, -1, 0, 2], torch.rand(4, 9), "without_replacement", aux_tokens=[1, 2],
                     aux_depths=[1, 2], aux_mask=torch.ones(2, 2, dtype=torch.bool))
    cut = first_nodes(tree, 3)
    assert cut.tokens == [5, 6, 7] and cut.parents == [-1, -1, 0] and cut.draft_probs.shape == (3, 9)
    assert cut.aux_tokens == [1, 2] and cut.siblings == "without_replacement" and first_nodes(tree, 9) is tree


def test_sizing_auto_trees_are_lossless(tiny_model, prompts, one_thread):
    torch.manual_seed(0)
    heads = MedusaHeads(64, 3).double()
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.05)
    profile = linear_profile(0.001, 0.0002)
    auto = PlannedDrafter(MedusaDrafter(tiny_model, choices="mc_sim_7b_63", tree_size=20, heads=heads), profile,
                          tiny_model.device)
    engine = SpeculativeEngine(tiny_model, auto)
    for prompt in prompts:
        assert engine.generate(prompt, StopCondition(40)).tokens == vanilla_tokens(tiny_model, prompt, 40)
    assert None in auto.plans and len(set(auto.plans)) > 1


def test_run_with_sizing_auto_makes_the_profile_and_reports_time_shares(compose, tmp_path):
    summary = run(compose("method=pld", "method.sizing=auto", "task=qa", "task.limit=2"))
    out = tmp_path / "run"
    answers = read_jsonl(out / "answers.jsonl")
    assert {a["method"] for a in answers} == {"pld+auto"} and all(a["exact_match"] for a in answers)
    profiles = list((tmp_path / "profiles").glob("tiny-*.json"))
    assert len(profiles) == 1 and json.loads(profiles[0].read_text())["lengths"] == [1, 2, 4, 8]
    row = summary.iloc[-1]
    # the phases' reads lie inside each turn's timed block (nested, so load cannot break <= 1); every phase ran
    assert all(row[f"{p}_share"] > 0 for p in PHASES) and sum(row[f"{p}_share"] for p in PHASES) <= 1.0
    assert row.mean_verified_tokens >= 1.0 and row.predicted_speedup > 0
    assert "predicted_speedup" in pd.read_csv(out / "summary.csv").columns


def test_a_run_says_where_its_profile_was_measured_in_one_line_and_in_meta(compose, tmp_path, capsys):
    """The predicted speedup names its profile: none (NaN, and the command that makes one), this host's (made by an
    auto run), or another host's of the same CPU model (and the command that measures this one's)."""
    import socket

    from bench.planning.profile import setting_command

    def ran(name: str, *overrides: str) -> tuple[list[str], dict]:
        """The run's lines on its profile, and its meta.json's profile_origin."""
        out = tmp_path / "runs" / name
        run(compose("method=pld", "task=qa", "task.limit=1", f"out_dir={out}", *overrides))
        notes = [line for line in capsys.readouterr().out.splitlines() if "forward-time profile" in line]
        return notes, json.loads((out / "meta.json").read_text())["profile_origin"]

    command = setting_command(compose(), torch.device("cpu"))
    assert ran("none") == ([f"predicted_speedup: NaN, no forward-time profile for this setting; measure one with: "
                            f"{command}"], None)
    notes, origin = ran("here", "method.sizing=auto")  # makes the profile on this host
    path = next((tmp_path / "profiles").glob("tiny-*.json"))
    stored = json.loads(path.read_text())
    assert origin == {"file": str(path), "host": socket.gethostname(), "this_host": True,
                      "measured": stored["measured"], "device_name": stored["setting"]["device_name"]}
    assert notes == [f"predicted_speedup and method.sizing=auto from the forward-time profile {path}, measured on "
                     f"this host ({stored['measured']})"]
    path.write_text(json.dumps({**stored, "host": "elsewhere"}))  # the same CPU model on another host
    notes, origin = ran("elsewhere")
    assert origin == {"file": str(path), "host": "elsewhere", "this_host": False, "measured": stored["measured"],
                      "device_name": stored["setting"]["device_name"]}
    assert notes == [f"predicted_speedup from the forward-time profile {path}, measured on host elsewhere "
                     f"({stored['measured']}) with this host's {stored['setting']['device_name']}; this host's: "
                     f"{command} profile.force=true"]


def test_out_dir_names_auto_runs_apart(compose):
    from bench.config import compose_config

    assert folder_stem(compose_config("method=pld").out_dir).endswith("/pld/mt_bench")
    assert folder_stem(compose_config("method=pld", "method.sizing=auto").out_dir).endswith("/pld+auto/mt_bench")


def test_sizing_auto_is_refused_for_vanilla_and_bad_values(compose):
    from bench.errors import ConfigError
    from bench.validate import validate

    with pytest.raises(ConfigError, match="method.sizing=auto: method=vanilla drafts nothing"):
        validate(compose("+method.sizing=auto"))
    with pytest.raises(ConfigError, match="method.sizing=big: must be upstream or auto"):
        validate(compose("method=pld", "method.sizing=big"))
    with pytest.raises(ConfigError, match="method.budget=auto: method=vanilla drafts nothing"):
        validate(compose("+method.budget=auto"))
    with pytest.raises(ConfigError, match="method.budget=big: must be upstream or auto"):
        validate(compose("method=pld", "method.budget=big"))


def test_report_shows_predicted_beside_measured_and_the_forward_time_plot(compose, tmp_path):
    """Two runs (pld with its upstream setting, then pld+auto, which makes the profile) -> the report's cost table
    has both with measured and predicted speedups and phase shares, and plots the profile."""
    from bench.report.render import write_report
    from tests.test_report import table_rows

    run(compose("method=pld", "task=qa", "task.limit=2", "out_dir=" + str(tmp_path / "runs" / "pld")))
    run(compose("method=pld", "method.sizing=auto", "task=qa", "task.limit=2",
                "out_dir=" + str(tmp_path / "runs" / "pld+auto")))
    board = write_report(tmp_path / "runs", tmp_path / "report")
    overall = board[board.task == "overall"].set_index("method")
    assert pd.isna(overall.loc["pld", "predicted_speedup"])  # made before any profile existed
    measured = pd.read_csv(tmp_path / "runs" / "pld+auto" / "summary.csv").set_index("task").loc["overall"]
    assert overall.loc["pld+auto", "predicted_speedup"] == pytest.approx(measured.predicted_speedup)
    assert overall.loc["pld+auto", "verify_share"] == pytest.approx(measured.verify_share)  # the run's own figure
    text = (tmp_path / "report" / "leaderboard.md").read_text()
    costs = table_rows(text.split("### Where the time goes")[1])
    assert costs[0][:4] == ["method", "speedup", "predicted", "gap"]
    assert {r[0] for r in costs[2:]} == {"pld", "pld+auto"}
    auto_row = next(r for r in costs[2:] if r[0] == "pld+auto")
    assert auto_row[2].endswith("x") and auto_row[4].endswith("%")
    assert len(list((tmp_path / "report").glob("forward_time-*.png"))) == 1
    assert len(list((tmp_path / "report").glob("predicted_vs_measured-*.png"))) == 1


def test_a_planned_drafter_learns_across_prompts_as_its_drafter_does(tiny_model, prompts):
    """sizing=auto keeps a learning drafter's Spec-Bench warm-up and its rewind before each repeat."""
    from methods.recycling import RecyclingDrafter

    inner = RecyclingDrafter(tiny_model)
    auto = PlannedDrafter(inner, linear_profile(), tiny_model.device)
    assert auto.learns_across_prompts is True
    assert PlannedDrafter(PromptLookupDrafter(), linear_profile(), tiny_model.device).learns_across_prompts is False
    state = auto.learned_state()
    SpeculativeEngine(tiny_model, auto).generate(prompts[0], StopCondition(20))
    assert not torch.equal(inner.matrix.table, state)
    auto.restore_learned_state(state)
    assert torch.equal(inner.matrix.table, state)


def test_a_compiled_profile_times_the_compiled_engines_forwards(tiny_model, monkeypatch, one_thread):
    """compiled=True times the compiled engine's verification forward (CompiledTarget.verify) after each context
    held in its cache: a chain, then a binary tree, of L inputs; batched, StaticBatchCache's."""
    from bench.engine.target import CompiledTarget

    calls = []
    original = CompiledTarget.verify

    def recording(self, root, tree):
        calls.append((self.length, None if tree is None else ("chain" if tree.is_chain else "tree", len(tree))))
        return original(self, root, tree)

    monkeypatch.setattr(CompiledTarget, "verify", recording)
    seconds = measure_forward_times(tiny_model, [1, 3], [8, 20], repeats=1, compiled=True)
    assert all(t > 0 for table in seconds.values() for row in table for t in row)
    one_round = [(8, None), (8, ("chain", 2)), (20, None), (20, ("chain", 2)),
                 (8, None), (8, ("tree", 2)), (20, None), (20, ("tree", 2))]
    # the untimed round (which makes the graphs), then the timed one, each point right after an untimed one of its own
    assert calls == one_round + [call for call in one_round for _ in range(2)]
    batched = measure_forward_times(tiny_model, [1, 3], [8], repeats=1, batch=2, compiled=True)
    assert all(t > 0 for table in batched.values() for row in table for t in row)


def test_a_compiled_profile_refuses_what_the_compiled_engine_does_not_run(windowed_model, tiny_model):
    with pytest.raises(ProfileError, match=r"window layers\) eager; measure its profile with engine.compile=off"):
        measure_forward_times(windowed_model, [1], [8], repeats=1, compiled=True)
    with pytest.raises(ProfileError, match="lengths reach 256; the compiled engine's forwards take at most 128"):
        measure_forward_times(tiny_model, [1, 256], [8], repeats=1, compiled=True)


def test_a_compiled_run_plans_from_a_profile_of_compiled_forwards(compose, tmp_path, one_thread):
    """engine.compile=on with method.sizing=auto makes and reads a profile keyed `compiled` (a file of its own beside
    the eager one, which an eager run makes and reads)."""
    small = ("task=qa", "task.limit=1", "method.sizing=auto", "profile.lengths=[1,2,4]", "profile.contexts=[16]",
             "profile.repeats=1")
    for compile_, name in (("on", "compiled"), ("off", "eager")):
        out = tmp_path / "runs" / name
        summary = run(compose("method=pld", *small, f"engine.compile={compile_}", f"out_dir={out}"))
        assert summary.exact_match.iloc[-1] == 1.0
        origin = json.loads((out / "meta.json").read_text())["profile_origin"]
        stored = json.loads(Path(origin["file"]).read_text())
        assert stored["setting"].get("compiled", False) is (compile_ == "on")
        assert ("-compiled-" in Path(origin["file"]).name) is (compile_ == "on")
    assert len(list((tmp_path / "profiles").glob("tiny-*.json"))) == 2
