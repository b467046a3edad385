"""Prompt lookup decoding: the right n-gram is found, candidates match transformers', output equals vanilla."""
from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from methods.pld import PromptLookupDrafter
from tests.conftest import VOCAB
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, drafter_from_config


def proposal(context: list[int], max_tokens: int = 100, **knobs) -> list[int] | None:
    drafter = PromptLookupDrafter(**knobs)
    drafter.start(context)
    tree = drafter.propose(context, max_tokens)
    return None if tree is None else tree.tokens


def test_longest_ngram_wins_over_a_more_recent_shorter_one():
    #          the 3-gram (1 2 3) ...      ... a later (2 3) and a later (3) ...   ... and the context ends in 1 2 3
    context = [1, 2, 3, 20, 21, 22, 9, 2, 3, 30, 31, 3, 40, 41, 1, 2, 3]
    assert proposal(context) == [20, 21, 22, 9, 2, 3, 30, 31, 3, 40]  # num_pred_tokens = 10
    assert proposal(context, max_ngram_size=2) == [30, 31, 3, 40, 41, 1, 2, 3]  # latest (2 3)
    assert proposal(context, max_ngram_size=1) == [40, 41, 1, 2, 3]  # latest (3)


def test_latest_or_first_occurrence():
    context = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    assert proposal(context, match="latest") == [8, 2, 5, 6]
    assert proposal(context, match="first") == [7, 1, 5, 6, 8, 2, 5, 6]


def test_no_match_max_tokens_and_eos():
    assert proposal([1, 2, 3, 4]) is None  # the last n-gram never occurred before
    context = [7, 8, 9, 10, 11, 12, 7, 8]
    assert proposal(context, max_tokens=3) == [9, 10]  # at most max_tokens - 1 drafts
    assert proposal(context, max_tokens=1) is None

    class Target:  # the drafter reads EOS ids from target.generation_config, as transformers does
        generation_config = type("GenerationConfig", (), {"eos_token_id": [11]})()

    drafter = PromptLookupDrafter(Target())
    drafter.start(context)
    assert drafter.propose(context, 100).tokens == [9, 10]  # cut before the EOS token


def test_match_first_equals_transformers_prompt_lookup():
    """Growing contexts, the index updated incrementally: same candidates as transformers' generator."""
    rng = random.Random(0)
    for trial in range(20):
        context = [rng.randrange(6) for _ in range(rng.randrange(2, 12))]
        ours = PromptLookupDrafter(max_ngram_size=3, num_pred_tokens=4, match="first")
        ours.start(context)
        theirs = PromptLookupCandidateGenerator(num_output_tokens=4, max_matching_ngram_size=3, max_length=10_000)
        for _ in range(30):
            ids = torch.tensor([context])
            expected = theirs.get_candidates(ids)[0][0, len(context):].tolist()
            tree = ours.propose(context, 100)
            assert (tree.tokens if tree else []) == expected, (trial, context)
            context = context + [rng.randrange(6) for _ in range(rng.randrange(1, 4))]


def test_greedy_output_equals_vanilla(tiny_model, one_thread):
    """A prompt with a repeated span: PLD drafts from it, some drafts are accepted, output is unchanged."""
    generator = torch.Generator().manual_seed(3)
    span = torch.randint(0, VOCAB, (12,), generator=generator).tolist()
    for prompt in (span + span[:3], span * 3, span[:5]):
        for match in ("latest", "first"):
            out = assert_lossless(tiny_model, PromptLookupDrafter(match=match), prompt, 40)
            assert 1 + sum(out.accept_lengths) == 40
    # the model's own continuation of `span` repeated: copying from the prompt is right for a while
    out = assert_lossless(tiny_model, PromptLookupDrafter(), span * 3 + span[:4], 40)
    assert max(out.accept_lengths) > 1


def test_greedy_output_equals_vanilla_with_sliding_window(windowed_model, prompts, one_thread):
    """Chains on a model with sliding-window attention, prompts and answers longer than the window."""
    outs = [assert_lossless(windowed_model, PromptLookupDrafter(), prompt, 40) for prompt in prompts]
    assert max(max(out.accept_lengths) for out in outs) > 1


def test_config_builds_the_drafter_with_upstream_knobs(tiny_model):
    drafter = drafter_from_config("pld", tiny_model, None)
    assert isinstance(drafter, PromptLookupDrafter)
    assert (drafter.max_ngram_size, drafter.num_pred_tokens, drafter.keep_latest) == (3, 10, True)


@pytest.mark.real_model
def test_smollm2_summarization_equals_vanilla():
    assert assert_lossless_on_smollm2("pld") > 1.0
