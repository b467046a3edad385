"""SAM-Decoding (methods/samd.py) and its suffix automata (methods/suffix_automaton.py): matches against brute force,
linear size, the frozen corpus automaton, and lossless decoding (greedy, sampled, batched) with accepted drafts, with
the EAGLE-2 fallback (the default) and SAM-Decoding's own Token Recycling fallback."""
from __future__ import annotations

import json
import random

import pytest
import torch

from bench.engine.acceptance import Acceptance
from bench.engine.drafter import StepResult
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.errors import MissingArtifactError
from methods.eagle.checkpoints import TRAIN_COMMAND as EAGLE_TRAIN_COMMAND
from methods.eagle.dynamic import Eagle2Drafter
from methods.heads.self_distill import answer_path
from methods.recycling import RecyclingDrafter
from methods.samd import SamdDrafter
from methods.suffix_automaton import (
    SEPARATOR,
    FrozenAutomaton,
    Match,
    SuffixAutomaton,
    build_corpus_automaton,
    build_frozen,
)
from tests.conftest import make_tiny_model, vanilla_tokens
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, compose_method, drafter_from_config
from tests.test_batched import assert_batch_equals_batch_one, batch_prompts  # noqa: F401 (a fixture)
from tests.test_eagle import random_head
from tests.test_sampling_methods import CONFIGS, PROMPT, joint_test, target  # noqa: F401 (a fixture)

EAGLE2_TREE = {"total_token": 10, "depth": 4, "top_k": 3}  # a small EAGLE-2 tree for the tiny models


def occurs_ending_at(text: list[int], pattern: list[int], before: int) -> list[int]:
    """End positions (< before) of the occurrences of pattern in text, by brute force."""
    n = len(pattern)
    return [end for end in range(n - 1, before) if text[end - n + 1 : end + 1] == pattern]


def longest_earlier_suffix(text: list[int], stream: list[int]) -> int:
    """Length of the longest suffix of stream that occurs in text, by brute force."""
    return max([n for n in range(1, len(stream) + 1) if occurs_ending_at(text, stream[-n:], len(text))], default=0)


def random_sequence(seed: int, length: int, alphabet: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(alphabet) for _ in range(length)]


@pytest.mark.parametrize("seed, alphabet", [(0, 2), (1, 3), (2, 5), (3, 40)])
def test_carried_match_is_the_longest_earlier_suffix(seed, alphabet):
    """SamdDrafter.commit's match after each token, and each step's lookup with a root, equal brute force; the
    state's earliest occurrence is the first place the matched suffix ends."""
    sequence = random_sequence(seed, 160, alphabet)
    drafter = SamdDrafter(fallback="none")
    drafter.start([])
    for i, token in enumerate(sequence):
        drafter.commit([token])
        text = sequence[: i + 1]
        assert drafter.match.length == longest_earlier_suffix(text[:-1], text)
        root = (token * 7 + i) % alphabet
        looked_up = drafter.automaton.advance(drafter.match, root)
        assert looked_up.length == longest_earlier_suffix(text, text + [root])
        if looked_up.length:
            suffix = (text + [root])[-looked_up.length :]
            assert drafter.automaton.first_end[looked_up.state] == occurs_ending_at(text, suffix, len(text))[0]


@pytest.mark.parametrize("text", [random_sequence(4, 3000, 2), random_sequence(5, 3000, 50), [0] * 1000,
                                  [0] + [1] * 999, list(range(1000))])
def test_automaton_size_is_linear(text):
    automaton = SuffixAutomaton()
    for token in text:
        automaton.extend(token)
    assert len(automaton) <= 2 * len(text)
    assert sum(map(len, automaton.next)) <= 3 * len(text)


def test_frozen_automaton_matches_as_the_growing_one_and_survives_disk(tmp_path):
    documents = [random_sequence(seed, 120, 4) for seed in range(6)]
    frozen = build_frozen(documents, progress=False)
    growing = SuffixAutomaton()
    for document in documents:
        for token in document + [SEPARATOR]:
            growing.extend(token)
    loaded = FrozenAutomaton.load(frozen.save(tmp_path / "corpus.sam", {"corpus": "test"}), "build it")
    query = random_sequence(9, 300, 4)
    expected, match, match_loaded = Match(), Match(), Match()
    for token in query:
        expected, match = growing.advance(expected, token), frozen.advance(match, token)
        match_loaded = loaded.advance(match_loaded, token)
        assert match == match_loaded == expected
        following = loaded.continuation(match.state, 200)
        assert SEPARATOR not in following  # cut at the end of its document
        start = growing.first_end[expected.state] + 1
        assert following == growing.tokens[start : start + len(following)]


def test_missing_corpus_is_refused_naming_the_build_command(tmp_path):
    corpus = {"enabled": True, "path": str(tmp_path / "none.sam"), "auto_build": False}
    with pytest.raises(MissingArtifactError, match="build it with: python -m bench.datastore method=samd"):
        SamdDrafter(corpus=corpus, fallback="none")


class EosTokenizer:
    """What the corpus build reads of a tokenizer when the corpus is the target's answers."""

    eos_token_id, name_or_path = 2, "tiny"


def test_answers_corpus_is_prompt_and_answer_with_eos_after_each(tmp_path):
    """As SAM-Decoding's tools/gen_sam_alpaca.py: each document is prompt + the target's answer, EOS appended unless
    it ends with one; every shard of the self-distillation folder, in order."""
    answers = tmp_path / "answers"
    answers.mkdir()
    torch.save({"prompts": [[7, 8], [9]], "answers": [[10, 11], [12, 2]]}, answer_path(answers, 0))
    torch.save({"prompts": [[13]], "answers": [[]]}, answer_path(answers, 1))
    settings = {"source": "answers", "answers_dir": str(answers), "path": str(tmp_path / "corpus.sam")}
    corpus = FrozenAutomaton.load(build_corpus_automaton(EosTokenizer(), settings), "build it")
    assert corpus.tokens.tolist() == [7, 8, 10, 11, 2, SEPARATOR, 9, 12, 2, SEPARATOR, 13, 2, SEPARATOR]
    meta = json.loads((tmp_path / "corpus.sam" / "meta.json").read_text())
    assert (meta["corpus"], meta["answers_dir"], meta["documents"]) == ("answers", str(answers), 3)


def test_missing_answers_are_refused_naming_the_command(tmp_path):
    settings = {"source": "answers", "answers_dir": str(tmp_path), "path": str(tmp_path / "corpus.sam")}
    with pytest.raises(MissingArtifactError) as refused:
        build_corpus_automaton(EosTokenizer(), settings)
    assert str(refused.value) == (
        f"no answers of the target in {tmp_path}; make them with: python -m bench.train method=eagle "
        "features.source=self_distill (or set method.drafter.corpus.answers_dir, or "
        "method.drafter.corpus.source=sharegpt)")


def test_bad_fallback_is_refused():
    with pytest.raises(ValueError, match="method.drafter.fallback=eagle3: must be one of recycling, eagle2, none"):
        SamdDrafter(fallback="eagle3")


def repeating_case(model):
    """A prompt p + v + p, v being the model's own continuation of p: a model that sees only its last tokens
    (window 4, two layers, relative positions) continues it with v again, which the dynamic automaton copies."""
    p = random_sequence(7, 12, 96)
    v = vanilla_tokens(model, p, 40)
    return p + v + p, v


def test_repeating_prompt_drafts_from_the_dynamic_automaton():
    model = make_tiny_model(arch="mistral")
    prompt, continuation = repeating_case(model)
    drafter = SamdDrafter(model, fallback="none")
    with torch.inference_mode():
        out = assert_lossless(model, drafter, prompt, 40)
    assert out.tokens == continuation
    assert max(out.accept_lengths) >= 20  # whole chains copied from the prompt were accepted
    assert drafter.drafted_from == "dynamic"


def test_the_recycling_fallback_learns_from_a_chain_step_that_opens_a_turn(tiny_model):
    """The first decode step of a turn drafted by a SAM chain: the fallback never proposed, yet the step's root row
    is refreshed from its logits, as upstream's fallback updates on every step."""
    drafter = SamdDrafter(tiny_model, fallback="recycling", len_threshold=2)
    prompt = [5, 6, 7, 8, 5, 6, 7]
    drafter.start(prompt)
    tree = drafter.propose([*prompt, 8], max_tokens=8)  # 5 6 7 8 seen: the chain after root 8 copies 5 6 7 ...
    assert drafter.drafted_from == "dynamic" and list(tree.tokens)[:3] == [5, 6, 7]
    logits = torch.zeros(1 + len(tree), tiny_model.config.vocab_size)
    logits[0, 30:38] = torch.arange(8, 0, -1, dtype=logits.dtype)  # the root (8): successors 30..37
    drafter.update(StepResult(tree, logits, Acceptance([0], [30])))
    assert drafter.fallback.matrix.successors[8].tolist() == list(range(30, 38))


def test_greedy_is_lossless_with_and_without_fallback(tiny_model, prompts, one_thread):
    for prompt in prompts:
        with_fallback = assert_lossless(tiny_model, SamdDrafter(tiny_model, fallback="recycling"), prompt, 50)
        assert_lossless(tiny_model, SamdDrafter(tiny_model, fallback="none"), prompt, 50)
        recycling = RecyclingDrafter(tiny_model, template="samd", seed_from_prefill=True)
        alone = SpeculativeEngine(tiny_model, recycling).generate(prompt, StopCondition(50))
        assert with_fallback.accept_lengths == alone.accept_lengths  # no long matches here: the fallback drafts


def test_greedy_is_lossless_on_windowed_models(windowed_model, prompts, one_thread):
    for prompt in prompts + [prompts[1] * 3]:
        assert_lossless(windowed_model, SamdDrafter(windowed_model, len_threshold=2, fallback="recycling"), prompt, 40)


def test_corpus_automaton_drafts_the_continuation_it_holds(tiny_model, prompts, tmp_path, one_thread):
    """A corpus holding each prompt's continuation: its matches (the prompt's suffix) outrun the dynamic ones."""
    documents = [p + vanilla_tokens(tiny_model, p, 30) for p in prompts]
    path = build_frozen(documents, progress=False).save(tmp_path / "corpus.sam", {})
    drafter = SamdDrafter(tiny_model, fallback="none", corpus={"enabled": True, "path": str(path)})
    accepted = []
    for prompt in prompts[1:]:  # prompts long enough for a match of len_threshold + len_bias tokens
        out = assert_lossless(tiny_model, drafter, prompt, 30)
        accepted.append(max(out.accept_lengths))
        assert drafter.drafted_from == "corpus"
    assert min(accepted) >= 20


def test_each_step_costs_only_its_new_tokens(tiny_model, prompts, one_thread, monkeypatch):
    """The automaton takes each token once (no re-matching of the context): extend calls = tokens committed."""
    calls = []
    extend = SuffixAutomaton.extend
    monkeypatch.setattr(SuffixAutomaton, "extend", lambda self, token: (calls.append(token), extend(self, token)))
    drafter = SamdDrafter(tiny_model, fallback="recycling")
    prompt = prompts[2]
    out = SpeculativeEngine(tiny_model, drafter).generate(prompt, StopCondition(40))
    assert calls == drafter.automaton.tokens
    assert calls == (prompt + out.tokens)[: len(calls)] and len(calls) >= len(prompt) + len(out.tokens) - 2


def test_config_builds_the_upstream_drafter_with_the_eagle2_fallback(tiny_model, tmp_path):
    """On a model with an EAGLE head (a random one for the tiny model, where SmolLM2's home points): SAMD[EAGLE2]."""
    from methods.heads.common import save_heads

    save_heads(tmp_path / "eagle", {"specbench_method": "eagle"}, random_head(tiny_model, 1).state_dict(), {})
    drafter = drafter_from_config("samd", tiny_model, None, f"method.drafter.eagle2.checkpoint={tmp_path / 'eagle'}")
    assert isinstance(drafter, SamdDrafter) and isinstance(drafter.fallback, Eagle2Drafter)
    assert (drafter.n_predicts, drafter.len_threshold, drafter.len_bias, drafter.corpus) == (40, 5, 5, None)
    assert (drafter.fallback.total_token, drafter.fallback.depth, drafter.fallback.top_k) == (6, 2, 2)  # SmolLM2's
    assert drafter.feature_layers == Eagle2Drafter.feature_layers and not drafter.learns_across_prompts


def test_config_builds_sam_decodings_own_recycling_fallback(tiny_model):
    """fallback=recycling: SAM-Decoding's 60-node tree, a matrix carried over and seeded from the prefill (the
    engine then hands the prompt's features over)."""
    drafter = drafter_from_config("samd", tiny_model, None, "method.drafter.fallback=recycling")
    fallback = drafter.fallback
    assert isinstance(fallback, RecyclingDrafter)
    assert (len(fallback.template), fallback.k, fallback.carry_over, fallback.seed_from_prefill) == (60, 8, True, True)
    assert drafter.feature_layers == (-1,) and drafter.learns_across_prompts
    assert SamdDrafter(tiny_model, fallback="recycling", recycling={"carry_over": False}).learns_across_prompts is False


def test_recycling_fallback_is_seeded_from_the_prefill_and_carried_to_the_next_prompt(tiny_model, prompts, one_thread):
    """After a prompt's prefill the matrix rows of its tokens are set; the next prompt's turn starts from them."""
    drafter = SamdDrafter(tiny_model, fallback="recycling")
    engine = SpeculativeEngine(tiny_model, drafter)
    engine.generate(prompts[2], StopCondition(1))  # the prefill only
    seeded = drafter.fallback.matrix.successors
    assert all(seeded[t].abs().sum() > 0 for t in set(prompts[2])) and seeded.abs().sum(dim=1).count_nonzero() == len(
        set(prompts[2]))
    learned = seeded.clone()
    state = drafter.learned_state()
    drafter.start(prompts[0])  # no features: nothing seeded
    assert torch.equal(drafter.fallback.matrix.successors, learned)
    engine.generate(prompts[1], StopCondition(1))
    assert not torch.equal(drafter.fallback.matrix.successors, learned)
    drafter.restore_learned_state(state)
    assert torch.equal(drafter.fallback.matrix.successors, learned)
    assert eagle2_samd(tiny_model).learned_state() is None


def test_batched_rows_equal_batch_one(tiny_model, batch_prompts, one_thread):  # noqa: F811
    prompts = batch_prompts[:3] + [batch_prompts[1] * 3]  # one row with long dynamic matches
    make = lambda: SamdDrafter(tiny_model, len_threshold=3, fallback="recycling",  # noqa: E731
                               recycling={"carry_over": False})  # rows apart: each as at batch 1
    out = assert_batch_equals_batch_one(tiny_model, make, prompts, 30)
    assert any(n > 1 for turn in out.turns for n in turn.accept_lengths)


@pytest.mark.parametrize("knobs", [{"fallback": "recycling"}, {"len_threshold": 2, "fallback": "none"}])
def test_sampling_gives_the_targets_joint_distribution(target, knobs):  # noqa: F811
    """With the default threshold the Recycling fallback drafts; at 2, PROMPT's repeats give dynamic chains (the
    EAGLE-2 fallback: tests/test_sampling_methods.py's samd cases)."""
    cfg = CONFIGS["top_k"]
    statistic, critical, accept_lengths = joint_test(target, SamdDrafter(target, **knobs), cfg, 1200)
    assert statistic < critical, (statistic, critical)
    assert max(accept_lengths) >= 2  # drafts were really tried


@pytest.mark.real_model
def test_smollm2_summarization_equals_vanilla():
    """The default: the committed EAGLE head as the fallback (SAMD[EAGLE2])."""
    mean_accepted = assert_lossless_on_smollm2("samd")
    print(f"samd on SmolLM2: {mean_accepted:.2f} accepted tokens per target forward")
    assert mean_accepted > 1.0


@pytest.mark.real_model
def test_smollm2_with_the_recycling_fallback_equals_vanilla():
    """SAM-Decoding's own Token Recycling fallback (SAMD[Token Recycle]), built from the config as the runner does."""
    mean_accepted = assert_lossless_on_smollm2("samd", "method.drafter.fallback=recycling")
    print(f"samd[recycling] on SmolLM2: {mean_accepted:.2f} accepted tokens per target forward")
    assert mean_accepted > 1.0


# --- the EAGLE-2 fallback ------------------------------------------------------------------------------------------

def eagle2_samd(model, seed: int = 3, **knobs) -> SamdDrafter:
    """SAM-Decoding with the EAGLE-2 fallback over a random head for `model`."""
    return SamdDrafter(model, fallback="eagle2", eagle2={"head": random_head(model, seed), **EAGLE2_TREE}, **knobs)


def target_features(model, tokens: list[int]) -> torch.Tensor:
    """[len, H] the target's last hidden states (after the final norm: EagleDrafter's feature_layers) of `tokens`."""
    with torch.inference_mode():
        return model(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0]


def test_eagle2_fallback_asks_for_the_targets_features(tiny_model):
    drafter = eagle2_samd(tiny_model)
    assert isinstance(drafter.fallback, Eagle2Drafter) and drafter.feature_layers == Eagle2Drafter.feature_layers
    assert (drafter.fallback.total_token, drafter.fallback.depth, drafter.fallback.top_k) == (10, 4, 3)


def test_eagle2_fallback_head_follows_the_chain_steps(target, monkeypatch):  # noqa: F811
    """Steps the automaton drafted still feed the head their accepted tokens' features: every fallback tree, on a
    run where accepted chains and accepted trees interleave, equals the tree of a fresh EAGLE-2 drafter given the
    whole context's features at once."""
    proposed = []  # (context, tree) of each fallback step
    propose = Eagle2Drafter.propose
    monkeypatch.setattr(Eagle2Drafter, "propose", lambda self, context, max_tokens: proposed.append(
        (list(context), propose(self, context, max_tokens))) or proposed[-1][1])
    tree = {"total_token": 8, "depth": 3, "top_k": 2}
    drafter = SamdDrafter(target, len_threshold=3, fallback="eagle2", eagle2={"head": random_head(target, 1), **tree})
    out = assert_lossless(target, drafter, PROMPT, 60)
    steps = list(zip(out.accept_lengths, out.tree_steps))
    assert any(n > 1 and not is_tree for n, is_tree in steps) and any(n > 1 and is_tree for n, is_tree in steps)
    assert sum(is_tree for _, is_tree in steps) == len(proposed) >= 10
    for context, drafted in proposed:
        fresh = Eagle2Drafter(target, head=drafter.fallback.head, **tree)
        fresh.start(context[:-1], hidden=target_features(target, context[:-1]))
        expected = propose(fresh, context, 60)  # the original: the patched one records
        assert (drafted.tokens, drafted.parents) == (expected.tokens, expected.parents)


def test_greedy_is_lossless_with_the_eagle2_fallback(tiny_model, prompts, one_thread):
    for prompt in prompts + [prompts[1] * 3]:
        out = assert_lossless(tiny_model, eagle2_samd(tiny_model, len_threshold=3), prompt, 40)
        assert any(out.tree_steps)  # EAGLE-2's trees were verified
    mistral = make_tiny_model(arch="mistral")
    prompt, continuation = repeating_case(mistral)
    out = assert_lossless(mistral, eagle2_samd(mistral), prompt, 60)
    assert out.tokens[:40] == continuation and any(out.tree_steps) and not all(out.tree_steps)  # chains and trees


def test_eagle2_fallback_rows_equal_batch_one(tiny_model, batch_prompts, one_thread):  # noqa: F811
    """Batched rows (bench/batched.py forks the drafter per row) each keep their own head cache."""
    prompts = batch_prompts[:3] + [batch_prompts[1] * 3]
    out = assert_batch_equals_batch_one(tiny_model, lambda: eagle2_samd(tiny_model, len_threshold=3), prompts, 30)
    assert any(n > 1 for turn in out.turns for n in turn.verified_tokens)


def test_eagle2_fallback_settings_are_method_eagle2s():
    """samd's eagle2 knobs (conf/method_model/samd/<model>.yaml) are method=eagle2's for SmolLM2 (head and CPU tree);
    a model without an EAGLE head gets none and SAM-Decoding's 63/5/8 tree."""
    smollm2 = compose_method("samd").method.drafter.eagle2
    eagle2 = compose_method("eagle2").method.drafter
    assert [smollm2[k] for k in ("checkpoint", "total_token", "depth", "top_k")] == [
        eagle2[k] for k in ("checkpoint", "total_token", "depth", "top_k")]
    llama = compose_method("samd", "model=llama31_8b").method.drafter.eagle2
    assert (llama.checkpoint, llama.total_token, llama.depth, llama.top_k) == (None, 63, 5, 8)


@pytest.mark.parametrize("checkpoint, message", [
    ("null", r"eagle2 fallback needs an EAGLE head .* set method\.drafter\.eagle2\.checkpoint"),
    ("{tmp}/no_head", r"eagle checkpoint not found at .*no_head.*method\.drafter\.eagle2\.checkpoint")])
def test_missing_eagle_head_is_refused_naming_the_setting(tiny_model, tmp_path, checkpoint, message):
    with pytest.raises(MissingArtifactError, match=message) as refused:
        drafter_from_config("samd", tiny_model, None, "method.drafter.fallback=eagle2",
                            f"method.drafter.eagle2.checkpoint={checkpoint.format(tmp=tmp_path)}")
    assert "\n" not in str(refused.value)


def test_default_on_a_model_without_an_eagle_head_is_refused_in_one_line(tiny_model):
    with pytest.raises(MissingArtifactError) as refused:
        drafter_from_config("samd", tiny_model, None, "model=llama31_8b")
    assert str(refused.value) == (
        "SAM-Decoding's eagle2 fallback needs an EAGLE head and this model has none: set "
        "method.drafter.eagle2.checkpoint (in conf/method_model/samd/<model>.yaml; train one with: "
        f"{EAGLE_TRAIN_COMMAND}), or use the training-free method.drafter.fallback=recycling")
