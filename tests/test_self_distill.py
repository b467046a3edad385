"""Self-distillation data (methods/heads/self_distill.py): the target's own greedy answers, cached shard by shard, and
the feature sequences made of them."""
from __future__ import annotations

import json

import torch

from bench.models import eos_token_ids, load_model
from methods.heads.features import build_feature_cache, load_features
from methods.heads.self_distill import (
    answer_block,
    answer_sequences,
    first_turn_prompts,
    generate_answers,
    stored_answers,
)
from methods.heads.settings import AnswerSettings, FeatureSettings
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
    settings = AnswerSettings.from_config(cfg)
    folder = generate_answers(target, tokenizer, settings)
    pairs = list(stored_answers(settings))
    prompts = [p for _, p in zip(range(4), first_turn_prompts(tokenizer, 64, str(corpus)))]
    assert [p for p, _ in pairs] == prompts and len({len(p) for p in prompts}) > 1  # batches mix prompt lengths
    eos = frozenset(eos_token_ids(target, tokenizer))
    for prompt, answer in pairs:
        assert answer == generate_tokens(target, prompt, 6, eos)
    text = tokenizer.decode(prompts[0])
    assert text.startswith("<|im_start|>user\nQuestion 0") and text.endswith("<|im_start|>assistant\n")

    (folder / "answers-00001.pt").unlink()
    before = (folder / "answers-00000.pt").stat().st_mtime_ns
    generate_answers(target, tokenizer, settings)
    assert list(stored_answers(settings)) == pairs and (folder / "answers-00000.pt").stat().st_mtime_ns == before
    assert folder == tmp_path / "answers"


def test_committed_answers_with_the_same_pins_are_copied_in_not_generated(tiny_checkpoint, corpus, tmp_path,
                                                                          monkeypatch, one_thread):
    import methods.heads.self_distill as self_distill

    cfg = distill_config(tiny_checkpoint, corpus, tmp_path)
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    settings = AnswerSettings.from_config(cfg)
    committed = tmp_path / "artifacts" / "answers"
    monkeypatch.setattr(self_distill, "COMMITTED_ANSWERS", committed)
    made = generate_answers(target, tokenizer, settings)
    (made / "answers-00000.pt").rename(tmp_path / "kept.pt")  # the committed folder holds shard 0 only, edited
    (committed / "tiny").mkdir(parents=True)
    saved = torch.load(tmp_path / "kept.pt")
    saved["answers"][0] = [7, 7, 7]
    torch.save(saved, committed / "tiny" / "answers-00000.pt")
    (committed / "tiny" / "meta.json").write_text(json.dumps({"settings": settings.pins()}))
    monkeypatch.setattr(self_distill, "greedy_answers", None)  # generating shard 0 again would fail
    generate_answers(target, tokenizer, settings)
    assert next(iter(stored_answers(settings)))[1] == [7, 7, 7]  # shard 0 came from the committed folder

    for shard in made.glob("answers-*.pt"):
        shard.unlink()
    other = json.loads((committed / "tiny" / "meta.json").read_text())
    other["settings"]["max_new_tokens"] = 99
    (committed / "tiny" / "meta.json").write_text(json.dumps(other))
    monkeypatch.setattr(self_distill, "greedy_answers", lambda *args: [[5]] * len(args[1]))
    generate_answers(target, tokenizer, settings)  # other pins: the committed shards are not used
    assert next(iter(stored_answers(settings)))[1] == [5]


def test_self_distilled_features_train_on_the_answer_positions(tiny_checkpoint, corpus, tmp_path, one_thread):
    cfg = distill_config(tiny_checkpoint, corpus, tmp_path, "features.seq_len=64",
                         "features.self_distill.max_prompt_tokens=58")  # prompt + answer fit: no context cut
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    settings = FeatureSettings.from_config(cfg)
    build_feature_cache(target, answer_sequences(target, tokenizer, settings.answers, settings.seq_len), settings)
    train_set, heldout = load_features(settings)
    assert len(train_set) == 2 and len(heldout) == 2
    features = [heldout, train_set]
    for row, (prompt, answer) in enumerate(stored_answers(settings.answers)):
        part = features[row // 2]
        ids, mask, labels = part.input_ids[row % 2], part.mask[row % 2], part.labels[row % 2]
        assert ids[: len(prompt) + len(answer)].tolist() == prompt + answer
        assert mask.nonzero().flatten().tolist() == list(range(len(prompt) - 1, len(prompt) + len(answer) - 1))
        assert labels[mask].tolist() == answer  # the target's argmax there is its own greedy answer


def test_answer_block_keeps_the_answer_and_the_prompts_end_when_too_long():
    assert answer_block([1, 2, 3], [7, 8], 8, 0) == ([1, 2, 3, 7, 8, 0, 0, 0],
                                                     [False, False, True, True, False, False, False, False])
    assert answer_block([1, 2, 3, 4], [7, 8], 4, 0) == ([3, 4, 7, 8], [False, True, True, False])


def sps_distill_config(tiny_checkpoint, corpus, tmp_path, *overrides):
    from tests.test_train_stints import sps_config

    return sps_config(tiny_checkpoint, tmp_path, *SELF_DISTILL, f"features.corpus={corpus}", "features.seq_len=64",
                      "features.shard_sequences=2", f"features.self_distill.dir={tmp_path / 'answers'}", *overrides)


def test_the_sps_drafts_answer_loss_and_agreement_are_those_of_its_full_logits(tiny_checkpoint, corpus, tmp_path):
    from methods.sps.draft import slice_target
    from methods.sps.train import answer_agreement, answer_loss, block_tensors, split_answers

    cfg = sps_distill_config(tiny_checkpoint, corpus, tmp_path)
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    heldout, train_blocks = split_answers(target, tokenizer, FeatureSettings.from_config(cfg))
    assert len(heldout) == 2 and len(train_blocks) == 2
    # the whole target as a "draft" agrees with its own greedy answers everywhere; one layer of it does not
    assert answer_agreement(slice_target(target, list(range(target.config.num_hidden_layers))), heldout) == 1.0
    draft = slice_target(target, [0])
    ids, mask = block_tensors(train_blocks, "cpu")
    longest = max(len(p) + len(a) for p, a in list(stored_answers(AnswerSettings.from_config(cfg)))[2:])
    assert ids.shape[1] == longest  # cut after the longest
    with torch.no_grad():
        logits = draft(input_ids=ids).logits
    labels = torch.stack([ids[b, p + 1] for b, p in mask.nonzero().tolist()])
    expected = torch.nn.functional.cross_entropy(logits[mask], labels)
    assert torch.allclose(answer_loss(draft, ids, mask), expected, atol=1e-5)
    hits = (logits[mask].argmax(-1) == labels).float().mean()
    ids, mask = block_tensors(heldout, "cpu")
    with torch.no_grad():
        logits = draft(input_ids=ids).logits
    labels = torch.stack([ids[b, p + 1] for b, p in mask.nonzero().tolist()])
    assert answer_agreement(draft, heldout) == round(float((logits[mask].argmax(-1) == labels).float().mean()), 3)
    assert hits.item() < 1.0


def test_answer_batches_cover_every_block_once_an_epoch_and_resume_the_same_stream():
    from methods.sps.train import answer_batches

    blocks = [([i, i, 0], [True, False, False]) for i in range(5)]
    stream = answer_batches(blocks, 2, seed=3, start=0, device="cpu")
    firsts = [int(row[0]) for _ in range(5) for row in next(stream)[0]]  # 10 blocks: two epochs
    assert sorted(firsts[:5]) == list(range(5)) and sorted(firsts[5:]) == list(range(5))
    resumed = answer_batches(blocks, 2, seed=3, start=4, device="cpu")
    assert [int(row[0]) for _ in range(3) for row in next(resumed)[0]] == firsts[4:10]


def test_an_sps_stint_on_self_distilled_answers_records_its_data_and_agreement(tiny_checkpoint, corpus, tmp_path,
                                                                               one_thread):
    from methods.sps.train import train
    from tests.test_train_stints import sps_run

    out_dir = train(sps_run(sps_distill_config(tiny_checkpoint, corpus, tmp_path, "train.max_steps=3")))
    card = json.loads((out_dir / "card.json").read_text())
    (stint,) = card["stints"]
    assert stint["data"]["source"] == "self_distill" and stint["data"]["train_answers"] == 2
    assert stint["data"]["heldout_answers"] == 2 and stint["data"]["epochs"] == 3.0  # 3 steps of 2 of 2 answers
    assert "cross-entropy on the target's own greedy answer tokens" in card["objective"]
    agreement = card["mean_accepted_tokens"]["answer_agreement"]
    assert 0.0 <= agreement["before"] <= 1.0 and 0.0 <= agreement["after"] <= 1.0
    longest = max(len(p) + len(a) for p, a in list(stored_answers(AnswerSettings.from_config(
        sps_distill_config(tiny_checkpoint, corpus, tmp_path))))[2:])
    assert stint["tokens"] == card["tokens_seen"] == 3 * 2 * longest  # a batch: both answers, cut after the longer
