"""The shared engine is lossless: whatever the drafter proposes, greedy output equals plain decoding."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, MambaConfig, RwkvConfig

from bench.engine.drafter import Drafter
from bench.engine.kvcache import UnsupportedModelError
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.target import CompiledTarget, EagerTarget
from bench.engine.tree import DraftTree
from tests.conftest import VOCAB, generate_tokens, make_tiny_model, tiny_config, vanilla_tokens


class ScriptedDrafter(Drafter):
    """Proposes from a known reference continuation: `mode` decides how right the proposals are."""

    def __init__(self, reference: list[int], prompt_len: int, mode: str, width: int = 4):
        self.reference, self.prompt_len, self.mode, self.width = reference, prompt_len, mode, width
        self.steps: list[tuple[DraftTree, int]] = []

    def start(self, prompt_ids):
        pass

    def propose(self, context, max_tokens):
        done = len(context) - self.prompt_len  # tokens generated so far, the root included
        truth = self.reference[done : done + self.width]
        wrong = [(t + 1) % VOCAB for t in truth]
        if self.mode == "right":
            return DraftTree.chain(truth)
        if self.mode == "wrong":
            return DraftTree.chain(wrong)
        if self.mode == "half":
            return DraftTree.chain(truth[:2] + wrong[2:])
        if self.mode == "tree":  # a wrong branch first, then the right chain, plus a wrong sibling deeper down
            tokens, parents = [], []
            if truth:
                tokens += [wrong[0]] + truth
                parents += [-1, -1] + list(range(1, len(truth)))
            if len(truth) > 2:
                tokens.append(wrong[2])
                parents.append(2)
            return DraftTree(tokens, parents)
        raise ValueError(self.mode)

    def update(self, step):
        self.steps.append((step.tree, step.acceptance.num_accepted_drafts))


def test_vanilla_equals_transformers_generate(tiny_model, windowed_model, prompts):
    """The engine's no-draft path against the independent oracle, also on windowed attention and with an EOS."""
    for model in (tiny_model, windowed_model):
        for prompt in prompts:
            assert vanilla_tokens(model, prompt, 30) == generate_tokens(model, prompt, 30)
    eos = frozenset({generate_tokens(tiny_model, prompts[1], 30)[13]})
    assert vanilla_tokens(tiny_model, prompts[1], 30, eos) == generate_tokens(tiny_model, prompts[1], 30, eos)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("mode", ["right", "wrong", "half", "tree"])
def test_any_drafter_gives_vanilla_tokens(tiny_model, prompts, mode, compiled):
    for prompt in prompts:
        reference = vanilla_tokens(tiny_model, prompt, 30)  # eager decoding
        drafter = ScriptedDrafter(reference, len(prompt), mode)
        out = SpeculativeEngine(tiny_model, drafter, compile=compiled).generate(prompt, StopCondition(30))
        assert out.tokens == reference
        assert 1 + sum(out.accept_lengths) == 30  # the prefill made the first
        accepted = [n for _, n in drafter.steps]
        if mode == "wrong":
            assert set(accepted) == {0} and out.target_forwards == 30
        if mode == "half":
            assert max(accepted) == 2
        if mode in ("right", "tree"):
            assert max(accepted) == 4 and out.target_forwards < 30 / 4 + 2


@pytest.mark.parametrize("mode", ["right", "half", "tree"])
def test_sliding_window_models_give_generates_tokens(windowed_model, prompts, mode):
    """Prompts and answers longer than the attention window: accepted chains and trees leave the output unchanged."""
    for prompt in prompts:
        reference = generate_tokens(windowed_model, prompt, 30)
        drafter = ScriptedDrafter(reference, len(prompt), mode)
        out = SpeculativeEngine(windowed_model, drafter).generate(prompt, StopCondition(30))
        assert out.tokens == reference and max(n for _, n in drafter.steps) >= 2


def test_eos_stops_where_vanilla_stops(tiny_model, prompts):
    prompt = prompts[1]
    reference = vanilla_tokens(tiny_model, prompt, 30)
    eos = frozenset({reference[13]})
    expected = reference[: reference.index(reference[13]) + 1]
    assert vanilla_tokens(tiny_model, prompt, 30, eos) == expected
    drafter = ScriptedDrafter(reference, len(prompt), "right", width=6)
    assert SpeculativeEngine(tiny_model, drafter).generate(prompt, StopCondition(30, eos)).tokens == expected


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_kv_cache_keeps_exactly_the_accepted_path(tiny_model, prompts, compiled):
    """After a tree step the cache's first positions equal the cache of the prompt plus the accepted tokens fed one
    by one (a static cache keeps stale rows behind them, which no later mask shows)."""
    prompt = prompts[2]
    reference = vanilla_tokens(tiny_model, prompt, 8)
    root, truth = reference[0], reference[1:4]
    wrong = [(t + 1) % VOCAB for t in truth]
    tree = DraftTree([wrong[0], truth[0], truth[1], wrong[1], truth[2]], [-1, -1, 1, 1, 2])
    engine = SpeculativeEngine(tiny_model, compile=compiled)
    target = engine.target
    with torch.inference_mode():
        target.prefill(prompt, 8)
        logits, _ = target.verify(root, tree)
        acceptance = engine._accept(logits, tree, None)
        assert acceptance.rows == [0, 2, 3, 5] and acceptance.tokens == reference[1:5]
        target.keep(acceptance.rows)
        expected = DynamicCache(config=tiny_model.config)
        tiny_model(input_ids=torch.tensor([prompt + [root] + truth]), cache=expected)
    kept = len(prompt) + 4
    assert target.length == int(target.cache.get_seq_length()) == expected.get_seq_length() == kept
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if compiled else {}  # inductor's kernels round otherwise than eager's
    for got, want in zip(target.cache.layers, expected.layers):
        torch.testing.assert_close(got.keys[..., :kept, :], want.keys, **tolerance)
        torch.testing.assert_close(got.values[..., :kept, :], want.values, **tolerance)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("windowed", [False, True])
def test_tree_logits_match_sequential_decoding(tiny_model, windowed_model, prompts, windowed, compiled):
    """Every node's verifier logits equal those of decoding its path on its own (tree mask + positions); on
    windowed attention, with paths reaching past the window (which the compiled engine leaves to eager)."""
    model, prompt = (windowed_model, prompts[1]) if windowed else (tiny_model, prompts[0])
    tree = DraftTree([5, 6, 7, 8, 9, 10, 11], [-1, -1, 0, 1, 1, 4, 5])
    target = SpeculativeEngine(model, compile=compiled).target
    assert type(target).__name__ == ("CompiledTarget" if compiled and not windowed else "EagerTarget")
    with torch.inference_mode():
        target.prefill(prompt, 8)
        logits, _ = target.verify(3, tree)
        for node, path in enumerate([[5], [6], [5, 7], [6, 8], [6, 9], [6, 9, 10], [6, 9, 10, 11]]):
            full = model(input_ids=torch.tensor([prompt + [3] + path])).logits[0, -1]
            # inductor's kernels round otherwise than eager's: a whole uncached forward of this float64 model differs
            # by ~3e-6
            tolerance = {"rtol": 1e-4, "atol": 1e-5} if compiled else {}
            torch.testing.assert_close(logits[node + 1], full, **tolerance)


class FeatureRecorder(ScriptedDrafter):
    """A tree drafter that asks for the target's features and keeps those of the prompt and of each accepted path."""

    feature_layers = (-1, 1)  # the post-norm last layer and the first decoder layer's output, concatenated

    def start(self, prompt_ids, hidden=None):
        self.kept = [hidden]

    def update(self, step):
        super().update(step)
        self.kept.append(step.hidden[step.acceptance.rows])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_drafter_features_equal_an_uncached_forward_over_the_accepted_path(tiny_model, prompts, compiled):
    """The features a drafter receives (prompt, then the root and accepted nodes of each tree step) are the target's
    hidden states of an uncached forward over prompt + generated tokens, row for row."""
    prompt = prompts[1]
    reference = vanilla_tokens(tiny_model, prompt, 20)
    drafter = FeatureRecorder(reference, len(prompt), "tree")
    out = SpeculativeEngine(tiny_model, drafter, compile=compiled).generate(prompt, StopCondition(20))
    assert out.tokens == reference
    received = torch.cat(drafter.kept)  # [prompt + every root and accepted node, 2H]
    longer = vanilla_tokens(tiny_model, prompt, 30)  # the last step may accept past the stop; those rows count too
    with torch.inference_mode():
        full = tiny_model(input_ids=torch.tensor([prompt + longer]), output_hidden_states=True).hidden_states
    expected = torch.cat([full[-1][0], full[1][0]], dim=-1)
    assert len(prompt) + len(reference) - 1 <= len(received) <= len(expected)  # every position but the last token's
    # compiled, a whole uncached forward of this float64 model already differs from eager's by ~3e-6; 20 cached steps
    # carry it further
    tolerance = {"rtol": 1e-3, "atol": 2e-4} if compiled else {}
    torch.testing.assert_close(received, expected[: len(received)], **tolerance)
    assert max(n for _, n in drafter.steps) == 4  # accepted paths of several nodes were checked


def test_drafters_without_feature_layers_get_no_features(tiny_model, prompts):
    reference = vanilla_tokens(tiny_model, prompts[0], 8)
    drafter = ScriptedDrafter(reference, len(prompts[0]), "tree")
    seen = []
    drafter.update = lambda step: seen.append(step.hidden)
    SpeculativeEngine(tiny_model, drafter).generate(prompts[0], StopCondition(8))
    assert seen and all(h is None for h in seen)


@pytest.mark.parametrize("config, layer_type", [
    (MambaConfig(vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=1), "'linear_attention'"),
    (RwkvConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2), "recurrent state"),
    (tiny_config("mistral", sliding_window=None, attention_chunk_size=8), "'chunked_attention'"),
])
def test_caches_that_cannot_be_cut_back_are_refused(config, layer_type):
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedModelError) as error:
        SpeculativeEngine(model)
    assert layer_type in str(error.value) and "\n" not in str(error.value)


def test_a_compiled_run_matches_vanilla_and_says_what_compiling_cost(compose, tmp_path, capsys, one_thread):
    """engine.compile=on end to end (pld on the tiny model): both sides compiled before timing, even with no warm-up,
    lossless, the seconds in meta.json and one line each; its folder and run key apart from the eager run's."""
    import json

    from bench.measure.run import run

    summary = run(compose("method=pld", "task=qa", "task.limit=2", "engine.compile=on", "warmup_tokens=0"))
    assert summary.exact_match.tolist() == [1.0, 1.0]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["compile_seconds"] > 0 and meta["compiled"] and meta["config"]["engine"]["compile"] == "on"
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("engine.compile")]
    assert [line.split("'s graphs")[0] for line in said] == ["engine.compile: the method", "engine.compile: "
                                                                                           "the baseline"]
    from bench.run_folder import settings_label

    assert settings_label(compose("engine.compile=on")) != settings_label(compose("engine.compile=off"))


def test_graphs_are_frozen_on_the_cpu_only():
    """Frozen (weights packed into the graph) on the CPU: 16-bit graphs of every size, float32 ones from PACKED_FROM
    rows; never on a GPU."""
    from bench.engine.compiled import PACKED_FROM, frozen

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert [frozen(rows, torch.float32, cpu) for rows in (1, PACKED_FROM - 1, PACKED_FROM, 128)] == \
        [False, False, True, True]
    assert frozen(1, torch.bfloat16, cpu) and frozen(1, torch.float16, cpu)
    assert not any(frozen(rows, dtype, gpu) for rows in (1, 128) for dtype in (torch.float32, torch.bfloat16))


def test_a_compiler_failure_runs_both_sides_eager_and_says_so(compose, tmp_path, capsys, monkeypatch, one_thread):
    """Where torch.compile fails, the run goes on eager on both sides under eager's run key, with one warning line
    that names the error and engine.compile=off; never a crash, never silently."""
    import json

    from bench.measure.run import run
    from bench.run_folder import settings_label

    def broken(self, *args, **kwargs):
        raise RuntimeError("InductorError: no kernel for this op\n(a long traceback)")

    monkeypatch.setattr(CompiledTarget, "precompile", broken)
    summary = run(compose("method=pld", "task=qa", "task.limit=2", "engine.compile=on"))
    assert summary.exact_match.tolist() == [1.0, 1.0]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["compiled"] is False and meta["compile_seconds"] is None
    warned = [line for line in capsys.readouterr().err.splitlines() if "compiling failed" in line]
    assert warned == ["warning: engine.compile: compiling failed (RuntimeError: InductorError: no kernel for this op);"
                      " both sides run eager (engine.compile=off skips compiling)"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "answers.jsonl").read_text().splitlines()]
    eager = tmp_path / "eager"
    run(compose("method=pld", "task=qa", "task.limit=2", "engine.compile=off", f"out_dir={eager}"))
    assert {row["run_key"] for row in rows} == {json.loads(line)["run_key"]
                                                for line in (eager / "answers.jsonl").read_text().splitlines()}
    assert settings_label(compose("engine.compile=on")) != settings_label(compose("engine.compile=off"))


def test_trees_larger_than_the_largest_graph_run_both_sides_eager_and_say_so(compose, tmp_path, capsys, one_thread):
    """A drafter whose trees can outgrow the largest compiled graph (most_nodes + 1 > 128 inputs, as ReDrafter's 45 x 5
    beams on a GPU model) runs eager on both sides, said in one line, rather than failing in the middle of a turn."""
    import json

    from bench.measure.run import run

    summary = run(compose("method=pld", "method.drafter.num_pred_tokens=200", "task=qa", "task.limit=1",
                          "engine.compile=on"))
    assert summary.exact_match.tolist() == [1.0, 1.0]
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["compiled"] is False
    assert "warning: engine.compile: pld's trees reach 201 inputs, more than the largest compiled graph's 128; both " \
           "sides run eager (engine.compile=off skips compiling)" in capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(("overrides", "compiled", "said"), [
    (("gen.max_new_tokens=128",), False, "eager: answers of at most 128 tokens do not repay compiling"),
    (("gen.max_new_tokens=256",), True, "compiled: answers of up to 256 tokens repay compiling"),
    (("gen.max_new_tokens=1024", "gen.batch_size=4"), False, "eager: a batch's graphs (gen.batch_size=4) take about"),
    (("gen.max_new_tokens=16", "engine.compile=on"), True, ""),
    (("gen.max_new_tokens=1024", "engine.compile=off"), False, ""),
])
def test_compile_auto_compiles_runs_long_enough_to_repay_it(compose, overrides, compiled, said):
    """engine.compile=auto (the default) compiles a batch-1 run whose answers may reach COMPILE_FROM_TOKENS tokens,
    saying why in one line, and is then the same run as on's (or off's): one folder, one run key."""
    from bench.run_folder import settings_label
    from bench.settings import compile_choice

    cfg = compose("method=pld", *overrides)
    choice, why = compile_choice(cfg)
    assert choice is compiled and why.startswith(said) and "\n" not in why
    if not any(o.startswith("engine.") for o in overrides):  # auto's: the same run as the choice it made
        explicit = "engine.compile=on" if compiled else "engine.compile=off"
        assert settings_label(cfg) == settings_label(compose("method=pld", *overrides, explicit))


def test_engine_compile_takes_auto_off_or_on(compose):
    from bench.errors import ConfigError
    from bench.validate import validate

    assert validate(compose("method=pld", "gen.batch_size=2", "engine.compile=on")).compiled  # batched too
    with pytest.raises(ConfigError, match="^engine.compile=fast: must be auto, off or on"):
        validate(compose("method=pld", "engine.compile=fast"))


def test_precompiled_graphs_serve_every_step_without_compiling_again(tiny_model, prompts, one_thread):
    """precompile makes each bucket's graph as generate will call it (inference mode included), so no graph is made
    while a turn is timed."""
    from torch._dynamo.utils import counters

    from methods.pld import PromptLookupDrafter

    prompt = prompts[2] * 2  # repeats: PLD drafts
    engine = SpeculativeEngine(tiny_model, PromptLookupDrafter(), compile=True)
    engine.target.reserve(len(prompt) + 30)
    engine.target.precompile(prompt[:4], 16)
    made = counters["stats"]["unique_graphs"]
    out = engine.generate(prompt, StopCondition(30))
    assert any(n > 1 for n in out.verified_tokens)  # drafts were verified, in more than one bucket's graph
    assert counters["stats"]["unique_graphs"] == made


@pytest.mark.parametrize("queries", [1, 4])
def test_filled_attention_equals_attention_over_the_masked_buffer(queries):
    """filled_sdpa over the first StepSpan.positions of a cache buffer equals SDPA over the whole buffer with the
    positions past the span masked out (one query: no mask at all), grouped-query heads included."""
    from bench.engine.compiled import StepSpan, filled_sdpa

    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 6, queries, 8, generator=generator, dtype=torch.float64)
    key, value = (torch.randn(1, 2, 32, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    span = 11
    mask = torch.zeros(1, 1, queries, 32, dtype=torch.float64)
    mask[..., span:] = torch.finfo(torch.float64).min
    mask[0, 0, :, span - queries:span] += torch.triu(torch.full((queries, queries), -1e300, dtype=torch.float64), 1)
    StepSpan.positions = span
    got = filled_sdpa(query, key, value, mask, 0.3)
    want = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.3,
                                                            enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(got, want)
    assert got.shape == (1, queries, 6, 8)


def test_compiled_graphs_serve_each_target_its_own_weights_and_cache(prompts):
    """Graphs of 4 and more inputs have the weights frozen into them: a second model (the same class, other weights)
    and a second target on the first model (its own cache) each get logits equal to eager's, never another's."""
    tree = DraftTree([5, 6, 7], [-1, 0, 1])  # 4 inputs with the root: a frozen graph
    first = make_tiny_model(seed=0)
    for model in (first, make_tiny_model(seed=1), first):
        compiled, eager = CompiledTarget(model, (), {}), EagerTarget(model, (), {})
        with torch.inference_mode():
            for target in (compiled, eager):
                target.prefill(prompts[0], 8)
            for root in (3, 9):
                got, want = compiled.verify(root, tree)[0], eager.verify(root, tree)[0]
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
                compiled.keep([0, 1])
                eager.keep([0, 1])
