"""Every method is lossless under sampling at the shapes its configs ship: a seeded chi-square test of the joint
distribution of the first three new tokens against the target's exact joint, enumerated on a tiny float64 model with
a 16-token vocabulary (so that Medusa's and EAGLE-2's top-10 trees fit), at temperature 1, top-k and top-p.

The methods are not listed here: every conf/method/<m>.yaml is a case at each drafter shape it resolves to over the
models of conf/model/, its drafter built by the `tiny_drafter` beside its drafter class (random weights of the right
architecture for the tiny target), or, for a method without one, from its config's knobs.

A broken-rule twin (on a rejection, sample from p instead of the residual) must be caught by the same test, so the
test has the power to see a biased sampler."""
from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable
from pathlib import Path

import hydra.utils
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError
from transformers import LlamaConfig, LlamaForCausalLM

from bench.artifacts import PROJECT_ROOT
from bench.engine.acceptance import Acceptance
from bench.engine.drafter import NoDrafter
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig, logits_to_probs, sample
from methods.eagle.head import EagleHead
from methods.heads.tiny import random_weights
from tests.test_sampling import chi_square

VOCAB, HIDDEN, NEW = 16, 32, 3
PROMPT = [3, 1, 5, 2, 6, 3, 1, 5]  # repeats, so that PLD and lookahead find matches
CONFIGS = {"t1": SamplingConfig(temperature=1.0), "top_k": SamplingConfig(temperature=1.0, top_k=4),
           "top_p": SamplingConfig(temperature=1.0, top_p=0.8)}
# Knobs that locate an artifact or name a command or a seed, not the shape of what is drafted; nested blocks (a
# datastore's, a corpus's, a fallback drafter's settings) are not the shape either (a fallback's method has its cases).
NOT_SHAPE = frozenset({"checkpoint", "draft_path", "datastore", "build_command", "train_command", "seed"})


def method_cases(conf_dir: Path) -> list[tuple[str, str, dict | None]]:
    """(case id, method, resolved drafter knobs, None for vanilla) of every method in conf_dir/method/, once for each
    distinct shape its drafter has over the models of conf_dir/model/ (composed as `python -m bench method=<m>
    model=<model>` composes them; a model the method resolves nothing for is skipped). The id is the method's name,
    or `<method>:<model>` (the first model of that shape) when it has several shapes."""
    methods = sorted(p.stem for p in (conf_dir / "method").glob("*.yaml"))
    models = sorted(p.stem for p in (conf_dir / "model").glob("*.yaml"))
    cases = []
    with initialize_config_dir(str(conf_dir.resolve()), version_base="1.3"):
        for method in methods:
            shapes: dict[str, tuple[str, dict | None]] = {}
            for model in models:
                drafter = compose("config", overrides=[f"method={method}", f"model={model}"]).method.drafter
                try:
                    knobs = None if drafter is None else OmegaConf.to_container(drafter, resolve=True)
                except InterpolationResolutionError:
                    continue
                shapes.setdefault(shape_of(knobs), (model, knobs))
            cases += [(method if len(shapes) == 1 else f"{method}:{model}", method, knobs)
                      for model, knobs in shapes.values()]
    return cases


def shape_of(knobs: dict | None) -> str:
    if knobs is None:
        return "none"
    return repr(sorted((k, v) for k, v in knobs.items() if k not in NOT_SHAPE and not isinstance(v, dict)))


def eagle2_fallback_knobs(target) -> dict:
    """SAM-Decoding's EAGLE-2 fallback at SmolLM2's tree, over a random head (the config's is a checkpoint)."""
    return {"len_threshold": 2, "fallback": "eagle2",
            "eagle2": {"head": random_weights(EagleHead(target.config), seed=2).to(target.dtype),
                       "total_token": 6, "depth": 2, "top_k": 2}}


# Shapes no config ships, for coverage: (case id, method, knobs over its first discovered case's, or a function of
# the tiny target giving them). EAGLE-2 deeper than its tree keeps (4/3/3: 39 candidates, 3 verified) and with more
# children per node than nodes verified (6/2/4); SAM-Decoding with a short match threshold, so that the prompt's
# repeats give chains as well as fallback trees, with each fallback.
EXTRA_CASES = [("eagle2:4/3/3", "eagle2", {"total_token": 4, "depth": 3, "top_k": 3}),
               ("eagle2:6/2/4", "eagle2", {"total_token": 6, "depth": 2, "top_k": 4}),
               ("samd:chains", "samd", {"len_threshold": 2}),
               ("samd:eagle2", "samd", eagle2_fallback_knobs)]


def all_cases() -> dict[str, tuple[str, dict | None, Callable | None]]:
    """Case id -> (method, drafter knobs, a function of the tiny target giving more knobs or None): the discovered
    cases, then EXTRA_CASES."""
    cases = {case: (method, knobs, None) for case, method, knobs in DISCOVERED}
    first = {}
    for method, knobs, _ in cases.values():
        first.setdefault(method, knobs)
    for case, method, extra in EXTRA_CASES:
        cases[case] = (method, first[method], extra) if callable(extra) else (method, {**first[method], **extra}, None)
    return cases


DISCOVERED = method_cases(PROJECT_ROOT / "conf")
CASES = all_cases()


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).double().eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield model
    torch.set_num_threads(threads)


@torch.no_grad()
def exact_joint(model, cfg: SamplingConfig) -> dict[tuple, float]:
    """P(first NEW tokens = s) for every continuation s with nonzero probability."""
    paths = {(): 1.0}
    for _ in range(NEW):
        seqs = list(paths)
        probs = logits_to_probs(model(torch.tensor([PROMPT + list(s) for s in seqs])).logits[:, -1], cfg).double()
        paths = {s + (t,): paths[s] * float(row[t]) for s, row in zip(seqs, probs) for t in range(VOCAB) if row[t] > 0}
    return paths


def make_drafter(case: str, model, cfg: SamplingConfig, tmp_path):
    """The case's drafter on the tiny target: its module's `tiny_drafter` (random weights of the right
    architecture), else its class built from the knobs, as the runner builds it."""
    _, knobs, extra = CASES[case]
    if knobs is None:
        return NoDrafter()
    knobs = {**knobs, **(extra(model) if extra else {})}
    cls = hydra.utils.get_class(knobs.pop("_target_"))
    tiny = getattr(importlib.import_module(cls.__module__), "tiny_drafter", None)
    if tiny is not None:
        return tiny(model, cfg, knobs, tmp_path)
    if cls.samples:
        knobs["sampling"] = cfg
    return cls(target=model, tokenizer=None, **knobs)


def joint_counts(model, drafter, cfg: SamplingConfig, runs: int,
                 compiled: bool = False) -> tuple[dict[tuple, int], list[int]]:
    engine = SpeculativeEngine(model, drafter, cfg, compile=compiled)
    counts: dict[tuple, int] = {}
    accept_lengths: list[int] = []
    for seed in range(runs):
        out = engine.generate(PROMPT, StopCondition(NEW), seed=seed)
        key = tuple(out.tokens[:NEW])
        counts[key] = counts.get(key, 0) + 1
        accept_lengths += out.accept_lengths
    return counts, accept_lengths


def joint_test(model, drafter, cfg: SamplingConfig, runs: int,
               compiled: bool = False) -> tuple[float, float, list[int]]:
    """(chi-square statistic, critical value at p = 1e-3, accept lengths) of the sampled joint against the exact
    (`compiled`: decoded by the compiled engine, engine.compile=on)."""
    exact = exact_joint(model, cfg)
    counts, accept_lengths = joint_counts(model, drafter, cfg, runs, compiled)
    assert set(counts) <= set(exact), "a continuation the target gives probability 0 was emitted"
    keys = list(exact)
    statistic, critical = chi_square(torch.tensor([counts.get(k, 0) for k in keys], dtype=torch.float64),
                                     torch.tensor([exact[k] for k in keys], dtype=torch.float64))
    return statistic, critical, accept_lengths


def resample_from_p(logits, tree, cfg, generator) -> Acceptance:
    """The broken twin: each accepted node's first child x (drawn from q, or deterministic) is kept with probability
    min(1, p(x) / q(x)), but after a rejection the bonus token is drawn from p instead of the residual."""
    row, rows, tokens = 0, [0], []
    while True:
        p = logits_to_probs(logits[row], cfg).double()
        children = tree.children[row] if tree is not None and len(tree) else []
        if children:
            node = children[0]
            token = tree.tokens[node]
            q = 1.0 if tree.draft_probs is None else float(tree.draft_probs[node][token])
            if torch.rand(1, generator=generator).item() * q < float(p[token]):
                rows.append(node + 1)
                tokens.append(token)
                row = node + 1
                continue
        tokens.append(sample(p, generator))
        return Acceptance(rows, tokens)


def shipped_cases(method: str, every: bool = False) -> list[str]:
    """The method's first discovered case (every one with `every`): a shape its configs ship."""
    found = [case for case, found_method, _ in DISCOVERED if found_method == method]
    assert found, f"conf/method/{method}.yaml is gone: choose another method here"
    return found if every else found[:1]


# The drafters whose own probabilities enter the rule, and deterministic trees (static and dynamic), at temperature 1
# and under top-p too
SAMPLING_DRAFTERS = [*shipped_cases("vanilla"), *shipped_cases("sps"), *shipped_cases("medusa"),
                     *shipped_cases("eagle"), *shipped_cases("eagle2", every=True), *shipped_cases("pard"),
                     *shipped_cases("dflash")]
# The broken-rule twin: a chain (SpS), static trees of deterministic (Medusa) and of drawn siblings (EAGLE), dynamic
# trees (EAGLE-2), trees of merged candidate sequences (MLPSpeculator) and of deduplicated beams (ReDrafter), a block
# drafted in one forward (DFlash)
TWIN_DRAFTERS = [*shipped_cases("sps"), *shipped_cases("medusa"), *shipped_cases("eagle2", every=True),
                 *shipped_cases("eagle"), *shipped_cases("mlp_speculator"), *shipped_cases("pard"),
                 *shipped_cases("dflash"), *shipped_cases("redrafter")]
SAMPLING_CASES = ([(case, "top_k") for case in CASES]
                  + [(case, config) for config in ("t1", "top_p") for case in SAMPLING_DRAFTERS])


@pytest.mark.parametrize("case, config", SAMPLING_CASES)
def test_method_samples_the_targets_joint_distribution(target, case, config, tmp_path):
    """Every method at every shipped shape under top-k sampling (the most powerful test here: 64 outcomes); the
    drafters whose own probabilities enter the rule, and a deterministic-tree method, also at temperature 1 and
    under top-p."""
    cfg = CONFIGS[config]
    statistic, critical, accept_lengths = joint_test(target, make_drafter(case, target, cfg, tmp_path), cfg, 1200)
    assert statistic < critical, (statistic, critical)
    if CASES[case][0] not in ("vanilla", "pld", "lookahead"):  # the drafts were really tried: some steps accepted one
        assert max(accept_lengths) >= 2


# The compiled engine (engine.compile=on): chains drafted by compiled draft models (SpS, PARD's K rows in one forward),
# static and dynamic trees drafted by compiled EAGLE heads, a static tree of an eager drafter (Medusa), vanilla
COMPILED_DRAFTERS = [*shipped_cases("vanilla"), *shipped_cases("sps"), *shipped_cases("pard"),
                     *shipped_cases("eagle"), *shipped_cases("eagle2"), *shipped_cases("medusa")]


@pytest.mark.parametrize("case", COMPILED_DRAFTERS)
def test_the_compiled_engine_samples_the_targets_joint_distribution(target, case, tmp_path):
    cfg = CONFIGS["top_k"]
    drafter = make_drafter(case, target, cfg, tmp_path)
    statistic, critical, accept_lengths = joint_test(target, drafter, cfg, 1200, compiled=True)
    assert statistic < critical, (statistic, critical)
    assert CASES[case][0] == "vanilla" or max(accept_lengths) >= 2
    assert CASES[case][0] not in ("sps", "pard", "eagle", "eagle2") or drafter.network.compiled


@pytest.mark.parametrize("case", TWIN_DRAFTERS)
def test_the_joint_test_catches_a_broken_rule(target, case, tmp_path, monkeypatch):
    monkeypatch.setattr("bench.engine.loop.speculative_sampling_accept", resample_from_p)
    cfg = CONFIGS["top_k"]
    statistic, critical, _ = joint_test(target, make_drafter(case, target, cfg, tmp_path), cfg, 1200)
    assert statistic > critical, "the joint test failed to catch resampling from p instead of the residual"


def test_exact_joint_is_a_distribution(target):
    for cfg in CONFIGS.values():
        assert sum(exact_joint(target, cfg).values()) == pytest.approx(1.0, abs=1e-6)  # float32 probabilities
    assert len(exact_joint(target, CONFIGS["top_k"])) <= 4 ** NEW
    assert all(len(s) == NEW for s in itertools.islice(exact_joint(target, CONFIGS["t1"]), 5))


# Drafters whose trees have no bound known ahead (the compiled engine then makes every bucket's graph): Lookahead's
# window and pool, adaptive SpS's growing γ.
UNBOUNDED = {"lookahead", "sps"}


@pytest.mark.parametrize("case", CASES)
def test_no_tree_outgrows_the_drafters_most_nodes(case, target, tmp_path):
    """most_nodes bounds every tree a drafter proposes, its auxiliary inputs included: the compiled engine makes its
    graphs up to that size only, before timing, so a larger tree would compile while timed."""
    method = CASES[case][0]
    drafter = make_drafter(case, target, SamplingConfig(), tmp_path)
    most, sizes, propose = drafter.most_nodes(), [], drafter.propose

    def recording(context, max_tokens):
        tree = propose(context, max_tokens)
        if tree is not None:
            sizes.append(len(tree) + len(tree.aux_tokens))
        return tree

    drafter.propose = recording
    SpeculativeEngine(target, drafter).generate(PROMPT * 3, StopCondition(24))
    assert sizes or method == "vanilla"
    assert most is not None or method in UNBOUNDED
    assert most is None or max(sizes, default=0) <= most
