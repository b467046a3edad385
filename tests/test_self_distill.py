"""Self-distillation data (methods/heads/self_distill.py): the target's own greedy answers, cached shard by shard, and
the feature sequences made of them."""
from __future__ import annotations

import torch

from bench.models import eos_token_ids, load_model
from methods.heads.features import build_feature_cache, load_features
from methods.heads.self_distill import (answer_block, answers_folder, first_turn_prompts, generate_answers,
                                        stored_answers)
from tests.conftest import generate_tokens
from tests.test_head_training import corpus, train_config  # noqa: F401 (a fixture)

SELF_DISTILL = ("features.source=self_distill", "features.self_distill.num_prompts=4",
                "features.self_distill.max_new_tokens=6", "features.self_distill.max_prompt_tokens=64",
                "features.self_distill.batch_size=3")


def distill_config(tiny_checkpoint, corpus, tmp_path, *overrides):
    return train_config(tiny_checkpoint, corpus, tmp_path, "medusa", *SELF_DISTILL,
                        f"features.self_distill.dir={tmp_path / 'answers'}", *overrides)


def test_answers_are_the_targets_own_greedy_generate_output_and_resume_by_shard(tiny_checkpoint, corpus, tmp_path,
                                                                               one_thread):
    cfg = distill_config(tiny_checkpoint, corpus, tmp_path)
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    folder = generate_answers(target, tokenizer, cfg)
    pairs = list(stored_answers(cfg))
    prompts = [p for _, p in zip(range(4), first_turn_prompts(tokenizer, 64, str(corpus)))]
    assert [p for p, _ in pairs] == prompts and len({len(p) for p in prompts}) > 1  # batches mix prompt lengths
    eos = frozenset(eos_token_ids(target, tokenizer))
    for prompt, answer in pairs:
        assert answer == generate_tokens(target, prompt, 6, eos)
    text = tokenizer.decode(prompts[0])
    assert text.startswith("<|im_start|>user\nQuestion 0") and text.endswith("<|im_start|>assistant\n")

    (folder / "answers-00001.pt").unlink()
    before = (folder / "answers-00000.pt").stat().st_mtime_ns
    generate_answers(target, tokenizer, cfg)
    assert list(stored_answers(cfg)) == pairs and (folder / "answers-00000.pt").stat().st_mtime_ns == before
    assert answers_folder(cfg) == folder


def test_self_distilled_features_train_on_the_answer_positions(tiny_checkpoint, corpus, tmp_path, one_thread):
    cfg = distill_config(tiny_checkpoint, corpus, tmp_path, "features.seq_len=64",
                         "features.self_distill.max_prompt_tokens=58")  # prompt + answer fit: no context cut
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    build_feature_cache(target, tokenizer, cfg)
    train_set, heldout = load_features(cfg)
    assert len(train_set) == 2 and len(heldout) == 2
    features = [heldout, train_set]
    for row, (prompt, answer) in enumerate(stored_answers(cfg)):
        part = features[row // 2]
        ids, mask, labels = part.input_ids[row % 2], part.mask[row % 2], part.labels[row % 2]
        assert ids[: len(prompt) + len(answer)].tolist() == prompt + answer
        assert mask.nonzero().flatten().tolist() == list(range(len(prompt) - 1, len(prompt) + len(answer) - 1))
        assert labels[mask].tolist() == answer  # the target's argmax there is its own greedy answer


def test_answer_block_keeps_the_answer_and_the_prompts_end_when_too_long():
    assert answer_block([1, 2, 3], [7, 8], 8, 0) == ([1, 2, 3, 7, 8, 0, 0, 0],
                                                     [False, False, True, True, False, False, False, False])
    assert answer_block([1, 2, 3, 4], [7, 8], 4, 0) == ([3, 4, 7, 8], [False, True, True, False])
