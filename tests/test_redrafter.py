"""ReDrafter (methods/redrafter/): upstream's drafter layout drafts as the paper's equations say, strict loading,
lossless greedy decoding, training."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig

from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.tiny import random_weights
from methods.mlp_speculator.drafter import tree_of_sequences
from methods.redrafter.checkpoints import load_redrafter
from methods.redrafter.drafter import ReDrafterDrafter
from methods.redrafter.head import PublishedRecurrentDrafter, SharedVocabRecurrentDrafter
from tests.conftest import VOCAB
from tests.drafters import recording
from tests.method_checks import (
    assert_lossless,
    assert_lossless_on_smollm2,
    assert_sizing_auto_run_lossless,
    compose_method,
)
from tests.test_head_training import corpus, train_config  # noqa: F401 (corpus: a fixture)
from tests.test_mlp_speculator import assert_one_line_refusal

HIDDEN = 64  # the tiny target's width
PROMPT = [5, 17, 3, 40, 9, 12]


def published_tensors(exit_dim: int, layers: int, rnn: bool, seed: int = 0,
                      vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    """Random float32 weights named as upstream's Drafter.save_pretrained names them."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator) * 0.3

    tensors = {f"lm_head.{layers}.weight": normal(vocab, exit_dim)}
    for i in range(layers):
        tensors |= {f"lm_head.{i}.linear.weight": normal(exit_dim, exit_dim),
                    f"lm_head.{i}.linear.bias": normal(exit_dim)}
    if exit_dim != 2 * HIDDEN:
        tensors |= {"input_proj.weight": normal(exit_dim, 2 * HIDDEN), "input_proj.bias": normal(exit_dim)}
    if rnn:
        tensors |= {"rnn_u.weight": normal(HIDDEN, HIDDEN), "rnn_u.bias": normal(HIDDEN),
                    "rnn_w.weight": normal(HIDDEN, HIDDEN)}
    return tensors


def write_published(folder, exit_dim: int = 2 * HIDDEN, layers: int = 2, rnn: bool = True, vocab: int = VOCAB,
                    **config) -> dict[str, torch.Tensor]:
    """An upstream drafter folder (DrafterConfig's config.json + model.safetensors) for the tiny target."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = published_tensors(exit_dim, layers, rnn, vocab=vocab)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "recurrent_drafting_drafter", "architectures": ["Drafter"], "vocab_size": vocab,
        "hidden_size": HIDDEN, "exit_dim": exit_dim, "num_draft_layers": layers, "num_lookback_tokens": -1,
        "rnn": rnn, **config}))
    return tensors


def reference_beams(tensors: dict, embedding: torch.Tensor, h: torch.Tensor, root: int, width: int, length: int,
                    layers: int, rnn: bool) -> list[list[int]]:
    """The paper's drafter and beam search written out (arXiv 2403.09919, eq. 1-2): s_0 = 0,
    s_k = SiLU(W e(y_k) + U s_{k-1} + b) (rnn false: s_{k-1} + e(y_k)); x = [h, s_k] (through input_proj when
    exit_dim != 2H), x <- x + SiLU(A_i x + a_i) per ResBlock, logits = L x; as upstream's compute_logits, only each
    beam's 50 best logits survive before the log-softmax. Each step every beam grows every token and the `width` best
    sums of log-probabilities live on. Returns the beams (root first), best first."""
    t = {k: v.double() for k, v in tensors.items()}

    def log_probs(state):
        x = torch.cat([h.double(), state])
        if "input_proj.weight" in t:
            x = t["input_proj.weight"] @ x + t["input_proj.bias"]
        for i in range(layers):
            x = x + torch.nn.functional.silu(t[f"lm_head.{i}.linear.weight"] @ x + t[f"lm_head.{i}.linear.bias"])
        logits = t[f"lm_head.{layers}.weight"] @ x
        kept = logits >= logits.topk(50).values[-1]
        return torch.log_softmax(logits[kept], dim=-1), kept.nonzero()[:, 0]

    beams = [((root,), torch.zeros(HIDDEN, dtype=torch.float64), 0.0)]
    for _ in range(length - 1):
        grown = []
        for tokens, state, score in beams:
            e = embedding[tokens[-1]].double()
            state = torch.nn.functional.silu(t["rnn_w.weight"] @ e + t["rnn_u.weight"] @ state + t["rnn_u.bias"]) \
                if rnn else state + e
            values, ids = log_probs(state)
            grown += [(tokens + (int(i),), state, score + float(v)) for v, i in zip(values, ids)]
        beams = sorted(grown, key=lambda beam: -beam[2])[:width]
    return [list(tokens) for tokens, *_ in beams]


def first_beams(model, drafter: ReDrafterDrafter) -> tuple[torch.Tensor, int, list[list[int]]]:
    """(h at the prompt's last token, the root, the drafter's beams) of the drafter's first step on PROMPT."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([PROMPT]), output_hidden_states=True)
    hidden, root = out.hidden_states[-1][0], int(out.logits[0, -1].argmax())
    drafter.start(PROMPT, hidden=hidden)
    return hidden[-1], root, drafter.beams(root, drafter.beam_length).tolist()


@pytest.mark.parametrize("exit_dim, layers, rnn", [(2 * HIDDEN, 2, True), (48, 1, True), (2 * HIDDEN, 0, False)])
def test_published_drafter_proposes_the_beams_the_equations_say(tiny_model, tmp_path, exit_dim, layers, rnn):
    tensors = write_published(tmp_path / "drafter", exit_dim, layers, rnn)
    drafter = ReDrafterDrafter(tiny_model, checkpoint=str(tmp_path / "drafter"), beam_width=6, beam_length=4)
    h, root, beams = first_beams(tiny_model, drafter)
    expected = reference_beams(tensors, tiny_model.get_input_embeddings().weight.detach(), h, root, 6, 4, layers, rnn)
    assert beams == expected
    tree = drafter.propose(PROMPT + [root], 10)
    assert tree == tree_of_sequences([beam[1:] for beam in expected])
    assert len(tree.tokens) < 6 * 3  # the beams share prefixes: deduplicated


@pytest.mark.parametrize("config, fragments", [
    ({"vocab_size": VOCAB + 1}, [f"vocabulary {VOCAB + 1}, this target has {HIDDEN} and {VOCAB}"]),
    ({"hidden_size": HIDDEN * 2}, [f"hidden size {HIDDEN * 2}", f"this target has {HIDDEN} and {VOCAB}"]),
    ({"model_type": "llama"}, ["describes no recurrent drafter", "recurrent_drafting_drafter"]),
    ({"exit_dim": 2 * HIDDEN + 1}, ["model.safetensors does not fit", "2 keys missing (input_proj.bias, "
                                    "input_proj.weight)", "of the wrong shape"]),
])
def test_published_drafter_that_does_not_fit_is_refused_in_one_line(tiny_model, tmp_path, config, fragments):
    folder = tmp_path / "drafter"
    write_published(folder)
    (folder / "config.json").write_text(json.dumps(json.loads((folder / "config.json").read_text()) | config))
    with pytest.raises(InvalidArtifactError) as error:
        load_redrafter(tmp_path / "drafter", tiny_model)
    assert_one_line_refusal(error, *fragments)


def test_published_config_without_a_field_and_weights_with_a_stray_key_are_refused(tiny_model, tmp_path):
    folder = tmp_path / "drafter"
    tensors = write_published(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "rnn"}))
    with pytest.raises(InvalidArtifactError) as error:
        load_redrafter(folder, tiny_model)
    assert_one_line_refusal(error, "config.json lacks rnn")
    (folder / "config.json").write_text(json.dumps(config))
    del tensors["rnn_w.weight"]
    save_file({**tensors, "rnn_v.weight": torch.zeros(HIDDEN, HIDDEN)}, folder / "model.safetensors")
    with pytest.raises(InvalidArtifactError) as error:
        load_redrafter(folder, tiny_model)
    assert_one_line_refusal(error, "1 key missing (rnn_w.weight)", "1 key unexpected (rnn_v.weight)")


def test_missing_checkpoint_says_how_to_make_one(tiny_model, tmp_path):
    with pytest.raises(MissingArtifactError) as error:
        load_redrafter(tmp_path / "none", tiny_model)
    assert_one_line_refusal(error, "python -m bench.train method=redrafter")


def random_drafter(model, seed: int = 0, rnn: bool = True) -> PublishedRecurrentDrafter:
    """A random upstream-layout drafter (one ResBlock) in float64 over `model`'s embedding."""
    drafter = random_weights(PublishedRecurrentDrafter(HIDDEN, 2 * HIDDEN, 1, rnn, VOCAB), seed=seed).double()
    return drafter.attach_embedding(model.get_input_embeddings())


def test_knobs_are_checked_and_the_beams_cut_to_the_step(tiny_model):
    with pytest.raises(ValueError, match="method.drafter.beam_length=1"):
        ReDrafterDrafter(tiny_model, beam_length=1, heads=random_drafter(tiny_model))
    drafter = ReDrafterDrafter(tiny_model, beam_width=3, beam_length=5, heads=random_drafter(tiny_model))
    drafter.start(PROMPT, hidden=torch.zeros(len(PROMPT), HIDDEN, dtype=torch.float64))
    assert max(drafter.propose(PROMPT, 2).depths) == 1  # max_tokens 2: one draft token
    assert drafter.propose(PROMPT, 1) is None
    assert drafter.beams(PROMPT[-1], 5).shape == (3, 5)


Recorder = recording(ReDrafterDrafter)


@pytest.mark.parametrize("beam_width, beam_length, rnn", [(4, 4, True), (1, 2, True), (10, 4, False), (45, 5, True)])
def test_greedy_redrafter_equals_vanilla(tiny_model, prompts, beam_width, beam_length, rnn, one_thread):
    accepted = []
    for seed, prompt in enumerate(prompts):
        heads = random_drafter(tiny_model, seed, rnn)
        drafter = Recorder(tiny_model, beam_width=beam_width, beam_length=beam_length, heads=heads)
        assert_lossless(tiny_model, drafter, prompt, 40)
        accepted += drafter.accepted
    assert 0 in accepted and max(accepted) >= 1


def test_train_redrafter_writes_a_loadable_checkpoint(tiny_checkpoint, corpus, tmp_path, one_thread):
    from bench.models import load_model
    from methods.heads.settings import TrainingRun
    from methods.heads.training import train_heads
    from methods.redrafter.train import ReDrafterRecipe

    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "redrafter", "train.num_draft_layers=1",
                       "train.draft_vocab_size=64", "train.recipe.predict_n_tokens=3")
    out_dir = train_heads(TrainingRun.from_config(cfg), ReDrafterRecipe(predict_n_tokens=3))
    card = json.loads((out_dir / "card.json").read_text())
    assert card["method"] == "redrafter" and [h["head"] for h in card["heldout_agreement"]] == [0, 1, 2]
    assert json.loads((out_dir / "config.json").read_text()) == {
        "specbench_method": "redrafter", "hidden_size": HIDDEN, "exit_dim": 2 * HIDDEN, "num_draft_layers": 1,
        "rnn": True}
    cfg.model.dtype = "float64"
    target, _ = load_model(cfg.model, torch.device("cpu"))
    drafter = ReDrafterDrafter(target, checkpoint=str(out_dir), beam_width=3, beam_length=3)
    assert isinstance(drafter.drafter, SharedVocabRecurrentDrafter) and drafter.vocab.size == 64
    assert_lossless(target, drafter, [5, 6, 7, 8, 9, 10], 20)


def test_training_loss_is_upstreams_teacher_forced_sum(tiny_model):
    """redrafter_loss = the sum over steps k of the mean cross-entropy over the kept positions t of the recursion
    run by hand: context h_t, state advanced on ids[t+1 .. t+k+1], target labels[t+k+1] (kept where the mask is)."""
    from methods.heads.common import DraftVocabulary
    from methods.heads.features import Features
    from methods.redrafter.train import redrafter_loss

    heads = random_weights(SharedVocabRecurrentDrafter(HIDDEN, 1), seed=2, std=0.1).double().requires_grad_(False)
    heads.attach_embedding(tiny_model.get_input_embeddings())
    vocab = DraftVocabulary(tiny_model.get_output_embeddings())
    ids, labels = torch.tensor([[3, 7, 11, 2, 5]]), torch.tensor([[7, 11, 2, 9, 4]])
    hidden = torch.randn(1, 5, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[True, True, False, True, True]])
    loss, outputs = redrafter_loss(heads, vocab, Features(ids, hidden, labels, mask), 3)
    expected, kept = 0.0, []
    for k in range(3):
        losses = []
        for t in range(5 - k - 1):
            if mask[0, t + k + 1]:
                state = torch.zeros(1, HIDDEN, dtype=torch.float64)
                for j in range(k + 1):
                    state = heads.advance(state, ids[:, t + j + 1])
                logits = heads.logits(hidden[:, t], state, vocab)
                losses.append(torch.nn.functional.cross_entropy(logits, labels[:, t + k + 1]).item())
        expected += sum(losses) / len(losses)
        kept.append(len(losses))
    assert [len(targets) for _, targets in outputs] == kept == [3, 2, 2]
    assert float(loss) == pytest.approx(expected, rel=1e-6)  # the sum is kept in float32


@pytest.mark.parametrize("batch_size", [1, 2])
def test_runs_with_a_published_drafter_and_sizing_auto_are_lossless(compose, tiny_checkpoint, tmp_path, batch_size,
                                                                    one_thread):
    """`python -m bench method=redrafter method.sizing=auto` on an upstream-layout drafter for the tiny target, at
    batch 1 and batched: every answer equals vanilla's."""
    write_published(tmp_path / "drafter", vocab=AutoConfig.from_pretrained(tiny_checkpoint).vocab_size)
    assert_sizing_auto_run_lossless(compose, tmp_path, "redrafter", batch_size,
                                    f"method.drafter.checkpoint={tmp_path / 'drafter'}", "method.drafter.beam_width=4",
                                    "method.drafter.beam_length=4")


def test_the_published_pair_for_gpu_users_is_vicuna_7b_with_apples_drafter():
    drafter = compose_method("redrafter", "model=vicuna_7b").method.drafter
    assert (drafter.checkpoint, drafter.beam_width, drafter.beam_length) == ("apple/recurrent-drafter-vicuna-7b", 45, 5)
    assert compose_method("redrafter", "model=vicuna_7b").model.path == "lmsys/vicuna-7b-v1.3"


@pytest.mark.real_model
def test_committed_redrafter_is_lossless_on_smollm2():
    mean_accepted = assert_lossless_on_smollm2("redrafter", category="writing", count=2)
    assert mean_accepted > 1.3


@pytest.mark.parametrize("draft_vocab, layers", [(None, 2), (60, 1)])
def test_our_drafter_in_upstreams_layout_drafts_the_same_beams(tiny_model, tmp_path, draft_vocab, layers):
    """methods/redrafter/checkpoints.py's upstream_layout: our drafter (random, over the full vocabulary or a 60-token
    slice) rewritten in upstream's layout loads as an upstream drafter and proposes the same beams with the same
    log-probabilities."""
    from methods.heads.common import DraftVocabulary
    from methods.redrafter.checkpoints import write_upstream_layout
    from methods.redrafter.drafter import warped_log_probs

    ids = None if draft_vocab is None else torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[
        :draft_vocab].sort().values
    vocab = DraftVocabulary(tiny_model.get_output_embeddings(), ids)
    heads = random_weights(SharedVocabRecurrentDrafter(HIDDEN, layers), seed=5, std=0.1).double()
    heads.attach_embedding(tiny_model.get_input_embeddings())
    write_upstream_layout(heads, vocab, tmp_path / "upstream")
    ours = ReDrafterDrafter(tiny_model, heads=heads, vocab=vocab, beam_width=5, beam_length=4)
    converted = ReDrafterDrafter(tiny_model, checkpoint=str(tmp_path / "upstream"), beam_width=5, beam_length=4)
    h, root, beams = first_beams(tiny_model, ours)
    assert first_beams(tiny_model, converted)[2] == beams
    state = torch.zeros(1, HIDDEN, dtype=torch.float64)
    with torch.inference_mode():
        for token in beams[0][:-1]:
            state = ours.drafter.advance(state, torch.tensor([token]))
            mine = vocab.full_probs(warped_log_probs(ours.drafter.logits(h[None], state, vocab)).exp())
            theirs = warped_log_probs(converted.drafter.logits(h[None], state, converted.vocab)).exp()
            torch.testing.assert_close(theirs, mine, atol=1e-6, rtol=1e-4)


def test_the_convert_command_writes_upstream_layout_of_a_saved_checkpoint(tiny_checkpoint, tmp_path, capsys):
    from bench.config import compose_config
    from bench.convert import main
    from bench.models import load_model
    from methods.heads.common import save_heads
    from tests.conftest import tiny_overrides

    overrides = tiny_overrides(tiny_checkpoint, tmp_path / "run")
    target, _ = load_model(compose_config(*overrides).model, torch.device("cpu"))
    heads = random_weights(SharedVocabRecurrentDrafter(HIDDEN, 1), seed=6, std=0.1)
    save_heads(tmp_path / "ours", {"specbench_method": "redrafter", "hidden_size": HIDDEN, "exit_dim": 2 * HIDDEN,
                                   "num_draft_layers": 1, "rnn": True}, heads.state_dict(), {})
    main(["redrafter", str(tmp_path / "ours"), str(tmp_path / "upstream"), *overrides])
    assert "apple/ml-recurrent-drafter's Drafter layout" in capsys.readouterr().out
    config = json.loads((tmp_path / "upstream" / "config.json").read_text())
    assert (config["model_type"], config["exit_dim"], config["num_draft_layers"]) == (
        "recurrent_drafting_drafter", 2 * HIDDEN + 1, 1)
    hidden = torch.randn(1, HIDDEN, dtype=target.dtype, generator=torch.Generator().manual_seed(0))
    drafters = [ReDrafterDrafter(target, checkpoint=str(tmp_path / name), beam_width=3, beam_length=3)
                for name in ("ours", "upstream")]
    for drafter in drafters:
        drafter.start([1, 2], hidden=hidden)
    assert drafters[1].beams(7, 3).tolist() == drafters[0].beams(7, 3).tolist()
