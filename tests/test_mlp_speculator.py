"""MLPSpeculator (methods/mlp_speculator/): the published layouts draft as the paper's equations say, strict loading,
lossless greedy decoding, training."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig

from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.tiny import random_weights
from methods.mlp_speculator.checkpoints import load_mlp_speculator
from methods.mlp_speculator.drafter import MLPSpeculatorDrafter, tree_of_sequences
from methods.mlp_speculator.head import PublishedMLPSpeculator
from tests.conftest import VOCAB
from tests.drafters import recording
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, assert_sizing_auto_run_lossless
from tests.test_head_training import corpus, train_config  # noqa: F401 (corpus: a fixture)

HIDDEN, INNER = 64, 48  # the tiny target's width; the stages' own
TOP_K, N_CANDIDATES = [4, 3, 2], 5
PROMPT = [5, 17, 3, 40, 9, 12]
IBM_NAMES = {"emb": "emb", "proj": "proj", "ln": "ln", "head": "head"}
SPECULATORS_NAMES = {"emb": "emb_layers", "proj": "proj_layers", "ln": "layernorms", "head": "head"}


def random_stages(seed: int = 0) -> PublishedMLPSpeculator:
    """Three published-layout stages for the tiny target, random float64 weights."""
    return random_weights(PublishedMLPSpeculator(HIDDEN, INNER, VOCAB, 3), seed=seed).double()


def stage_tensors(n_predict: int, seed: int, names: dict, tied: bool = False,
                  vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    """Random float32 stage weights named as a layout names them; tied: one tensor each (proj: stage 0 and one
    for the rest), as save_pretrained writes tied modules."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape, mean=0.0):
        return mean + torch.randn(*shape, generator=generator) * 0.3

    tensors = {}
    for i in range(n_predict):
        if not tied or i == 0:
            tensors[f"{names['emb']}.{i}.weight"] = normal(vocab, INNER)
            tensors[f"{names['head']}.{i}.weight"] = normal(vocab, INNER)
            tensors[f"{names['ln']}.{i}.weight"] = normal(INNER, mean=1.0)
            tensors[f"{names['ln']}.{i}.bias"] = normal(INNER)
        if not tied or i <= 1:
            tensors[f"{names['proj']}.{i}.weight"] = normal(INNER, HIDDEN if i == 0 else INNER)
    return tensors


def write_ibm(folder, n_predict: int = 3, tied: bool = False, scale_input: bool = False, vocab: int = VOCAB,
              **config) -> dict[str, torch.Tensor]:
    """An IBM accelerator folder (config.json + model.safetensors) for a target of the tiny width and `vocab` tokens;
    returns its tensors."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = stage_tensors(n_predict, 0, IBM_NAMES, tied, vocab)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator", "emb_dim": HIDDEN,
        "inner_dim": INNER, "vocab_size": vocab, "n_predict": n_predict, "top_k_tokens_per_head": TOP_K[:n_predict],
        "n_candidates": N_CANDIDATES, "tie_weights": tied, "scale_input": scale_input, **config}))
    return tensors


def write_speculators(folder, n_predict: int = 3, tied: bool = True, normalized: bool = True) -> dict:
    """A `speculators` mlp folder (its MLPSpeculatorConfig fields, its module names) for the tiny target."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = stage_tensors(n_predict, 1, SPECULATORS_NAMES, tied)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "speculators_model_type": "mlp", "architectures": ["MLPSpeculator"], "hidden_size": HIDDEN,
        "intermediate_size": INNER, "vocab_size": VOCAB, "num_layers": n_predict, "tie_weights": tied,
        "inputs_hidden_states_normalized": normalized}))
    return tensors


def reference_candidates(tensors: dict, names: dict, h: torch.Tensor, root: int, n_predict: int, top_k: list[int],
                         n_candidates: int, norm: str, tied: bool = False, scale_input: bool = False):
    """The paper's stages written out (arXiv 2404.19124, fms-extras' generate_suffixes): s_0 = h (normalised and
    divided by sqrt 2 with scale_input); s_i = GELU(LN_i(a s_{i-1} P_i^T + b E_i[x_{i-1}])), a = 0.5^(0.5/n),
    b = sqrt((1 - a^2) d / 2); every candidate keeps its top_k[i] tokens of softmax(s_i H_i^T), the n best sums of
    log-probabilities win. Returns the winning token sequences, best first."""
    a = 0.5 ** (0.5 / n_predict)
    b = math.sqrt((1 - a * a) * INNER / 2)

    def tensor(kind, i, suffix="weight"):
        stage = (min(i, 1) if kind == "proj" else 0) if tied else i
        return tensors[f"{names[kind]}.{stage}.{suffix}"].double()

    def normalise(x, i):
        if norm == "layer":
            x = (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-5)
        else:
            x = x / torch.sqrt((x * x).mean() + 1e-6)
        return x * tensor("ln", i) + tensor("ln", i, "bias")

    if scale_input:
        h = h / torch.sqrt((h * h).mean() + 1e-6) / math.sqrt(2)
    beams = [((), h.double(), root, 0.0)]
    for i in range(n_predict):
        grown = []
        for sequence, state, token, score in beams:
            state = torch.nn.functional.gelu(normalise(a * tensor("proj", i) @ state + b * tensor("emb", i)[token], i))
            logprobs = torch.log_softmax(tensor("head", i) @ state, dim=-1)
            for value, index in zip(*logprobs.topk(top_k[i])):
                grown.append((sequence + (int(index),), state, int(index), score + float(value)))
        beams = grown
    return [list(sequence) for sequence, *_ in sorted(beams, key=lambda beam: -beam[3])[:n_candidates]]


def first_candidates(model, drafter: MLPSpeculatorDrafter) -> tuple[torch.Tensor, int, list[list[int]]]:
    """(h at the prompt's last token, the root, the drafter's candidates) of the drafter's first step on PROMPT."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([PROMPT]), output_hidden_states=True)
    hidden, root = out.hidden_states[-1][0], int(out.logits[0, -1].argmax())
    drafter.start(PROMPT, hidden=hidden)
    return hidden[-1], root, drafter.candidates(root, drafter.n_predict).tolist()


@pytest.mark.parametrize("tied, scale_input", [(False, False), (True, False), (False, True)])
def test_ibm_checkpoint_drafts_as_the_equations_say(tiny_model, tmp_path, tied, scale_input):
    tensors = write_ibm(tmp_path / "ibm", tied=tied, scale_input=scale_input)
    drafter = MLPSpeculatorDrafter(tiny_model, checkpoint=str(tmp_path / "ibm"))
    assert (drafter.n_predict, drafter.top_k, drafter.n_candidates) == (3, TOP_K, N_CANDIDATES)  # config.json's
    h, root, candidates = first_candidates(tiny_model, drafter)
    expected = reference_candidates(tensors, IBM_NAMES, h, root, 3, TOP_K, N_CANDIDATES, "rms", tied, scale_input)
    assert candidates == expected
    tree = drafter.propose(PROMPT + [root], 10)
    assert tree == tree_of_sequences(expected)


def test_ibm_tensors_under_speculator_prefix_and_tied_copies_load(tiny_model, tmp_path):
    """Files naming their tensors `speculator.*` (vLLM strips the prefix) and a torch.save of tied modules, which
    repeats every stage's copy, load as the plain file does."""
    tensors = write_ibm(tmp_path / "plain", tied=True)
    folder = tmp_path / "prefixed"
    write_ibm(folder, tied=True)
    (folder / "model.safetensors").unlink()
    copies = {f"speculator.{kind}.{i}.{suffix}": tensors[f"{kind}.{min(i, 1) if kind == 'proj' else 0}.{suffix}"]
              for kind, suffix in (("emb", "weight"), ("proj", "weight"), ("head", "weight"), ("ln", "weight"),
                                   ("ln", "bias")) for i in range(3)}
    torch.save(copies, folder / "pytorch_model.bin")
    plain, prefixed = (load_mlp_speculator(tmp_path / name, tiny_model)[0].state_dict() for name in ("plain",
                                                                                                   "prefixed"))
    assert plain.keys() == prefixed.keys() and all(torch.equal(plain[k], prefixed[k]) for k in plain)


@pytest.mark.parametrize("tied", [True, False])
def test_speculators_checkpoint_drafts_as_the_equations_say(tiny_model, tmp_path, tied):
    tensors = write_speculators(tmp_path / "speculators", tied=tied)
    drafter = MLPSpeculatorDrafter(tiny_model, checkpoint=str(tmp_path / "speculators"),
                                   top_k_tokens_per_head=TOP_K, n_candidates=4)
    h, root, candidates = first_candidates(tiny_model, drafter)
    assert candidates == reference_candidates(tensors, SPECULATORS_NAMES, h, root, 3, TOP_K, 4, "layer", tied)


def assert_one_line_refusal(error, *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("config, fragments", [
    ({"vocab_size": VOCAB + 1}, [f"vocabulary {VOCAB + 1}, this target has {HIDDEN} and {VOCAB}"]),
    ({"emb_dim": HIDDEN * 2}, [f"hidden size {HIDDEN * 2}", f"this target has {HIDDEN} and {VOCAB}"]),
    ({"top_k_tokens_per_head": [4, 3]}, ["top_k_tokens_per_head [4, 3] has not n_predict=3 entries"]),
    ({"architectures": ["LlamaForCausalLM"]}, ["describes no MLPSpeculator", "MLPSpeculatorPreTrainedModel"]),
])
def test_ibm_config_that_does_not_fit_is_refused_in_one_line(tiny_model, tmp_path, config, fragments):
    write_ibm(tmp_path / "ibm", **config)
    with pytest.raises(InvalidArtifactError) as error:
        load_mlp_speculator(tmp_path / "ibm", tiny_model)
    assert_one_line_refusal(error, *fragments)


def test_ibm_weights_with_a_missing_or_unexpected_key_are_refused(tiny_model, tmp_path):
    tensors = write_ibm(tmp_path / "ibm")
    del tensors["head.2.weight"]
    tensors["head.3.weight"] = torch.zeros(VOCAB, INNER)
    save_file(tensors, tmp_path / "ibm" / "model.safetensors")
    with pytest.raises(InvalidArtifactError) as error:
        load_mlp_speculator(tmp_path / "ibm", tiny_model)
    assert_one_line_refusal(error, "model.safetensors does not fit", "1 key missing (head.2.weight)",
                            "1 key unexpected (head.3.weight)")


def test_speculators_checkpoint_reading_the_unnormalised_state_is_refused(tiny_model, tmp_path):
    write_speculators(tmp_path / "speculators", normalized=False)
    with pytest.raises(InvalidArtifactError) as error:
        load_mlp_speculator(tmp_path / "speculators", tiny_model)
    assert_one_line_refusal(error, "inputs_hidden_states_normalized false", "cannot draft here")


def test_missing_checkpoint_says_how_to_make_one(tiny_model, tmp_path):
    with pytest.raises(MissingArtifactError) as error:
        load_mlp_speculator(tmp_path / "none", tiny_model)
    assert_one_line_refusal(error, "python -m bench.train method=mlp_speculator")


def test_tree_merges_shared_prefixes():
    tree = tree_of_sequences([[1, 2, 3], [1, 2, 4], [5, 2, 3], [1, 6, 3]])
    assert (tree.tokens, tree.parents) == ([1, 5, 2, 2, 6, 3, 4, 3, 3], [-1, -1, 0, 1, 0, 2, 2, 3, 4])


def test_knobs_are_checked_and_cut_to_the_step(tiny_model):
    stages = random_stages()
    with pytest.raises(ValueError, match="n_predict=4 but the checkpoint has 3 stages"):
        MLPSpeculatorDrafter(tiny_model, n_predict=4, heads=stages)
    with pytest.raises(ValueError, match=r"method.drafter.top_k_tokens_per_head=\[2, 0\]: must be a list"):
        MLPSpeculatorDrafter(tiny_model, top_k_tokens_per_head=[2, 0], heads=stages)
    drafter = MLPSpeculatorDrafter(tiny_model, n_predict=2, top_k_tokens_per_head=[3, 2], n_candidates=4,
                                   heads=stages)
    drafter.start(PROMPT, hidden=torch.zeros(len(PROMPT), HIDDEN, dtype=torch.float64))
    assert max(drafter.propose(PROMPT, 2).depths) == 1  # max_tokens 2: one draft token
    assert len(drafter.candidates(PROMPT[-1], 2)) == 4


Recorder = recording(MLPSpeculatorDrafter)


@pytest.mark.parametrize("top_k, n_candidates", [([5, 4, 3], 5), ([1, 1, 1], 1), ([8, 4, 2], 12)])
def test_greedy_mlp_speculator_equals_vanilla(tiny_model, prompts, top_k, n_candidates, one_thread):
    accepted = []
    for seed, prompt in enumerate(prompts):
        drafter = Recorder(tiny_model, top_k_tokens_per_head=top_k, n_candidates=n_candidates,
                           heads=random_stages(seed))
        assert_lossless(tiny_model, drafter, prompt, 40)
        accepted += drafter.accepted
    assert 0 in accepted and max(accepted) >= 1


def test_train_mlp_speculator_writes_a_loadable_checkpoint(tiny_checkpoint, corpus, tmp_path, one_thread):
    from bench.models import load_model
    from methods.heads.settings import TrainingRun
    from methods.heads.training import train_heads
    from methods.mlp_speculator.train import MLPSpeculatorRecipe

    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "mlp_speculator", "train.n_predict=2",
                       "train.draft_vocab_size=64")
    out_dir = train_heads(TrainingRun.from_config(cfg), MLPSpeculatorRecipe())
    card = json.loads((out_dir / "card.json").read_text())
    assert card["method"] == "mlp_speculator" and [h["head"] for h in card["heldout_agreement"]] == [0, 1]
    assert json.loads((out_dir / "config.json").read_text()) == {
        "specbench_method": "mlp_speculator", "n_predict": 2, "scale_input": False, "top_k_tokens_per_head": [5, 4],
        "n_candidates": 5}
    cfg.model.dtype = "float64"
    target, _ = load_model(cfg.model, torch.device("cpu"))
    drafter = MLPSpeculatorDrafter(target, checkpoint=str(out_dir))
    assert (drafter.n_predict, drafter.top_k, drafter.n_candidates, drafter.vocab.size) == (2, [5, 4], 5, 64)
    assert_lossless(target, drafter, [5, 6, 7, 8, 9, 10], 20)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_runs_with_an_ibm_checkpoint_and_sizing_auto_are_lossless(compose, tiny_checkpoint, tmp_path, batch_size,
                                                                   one_thread):
    """`python -m bench method=mlp_speculator method.sizing=auto` on an IBM-layout checkpoint for the tiny target,
    at batch 1 and batched: every answer equals vanilla's."""

    write_ibm(tmp_path / "ibm", vocab=AutoConfig.from_pretrained(tiny_checkpoint).vocab_size)
    assert_sizing_auto_run_lossless(compose, tmp_path, "mlp_speculator", batch_size,
                                    f"method.drafter.checkpoint={tmp_path / 'ibm'}")


def test_the_published_pair_for_gpu_users_is_llama3_with_ibms_accelerator():
    from bench.config import compose_config

    cfg = compose_config("method=mlp_speculator", "model=llama3_8b")
    assert cfg.model.path == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert cfg.method.drafter.checkpoint == "ibm-ai-platform/llama3-8b-accelerator"
    assert [cfg.method.drafter[k] for k in ("n_predict", "top_k_tokens_per_head", "n_candidates")] == [None] * 3


@pytest.mark.parametrize("draft_vocab", [None, 40])
def test_our_stages_in_ibms_layout_draft_the_same_candidates(tiny_model, tmp_path, draft_vocab):
    """methods/mlp_speculator/checkpoints.py's ibm_layout: our stages (random, over the full vocabulary or a 40-token
    slice) rewritten in IBM's layout load as an IBM checkpoint and draft the same candidates."""
    from methods.heads.common import DraftVocabulary
    from methods.mlp_speculator.checkpoints import write_ibm_layout
    from methods.mlp_speculator.head import SharedVocabMLPSpeculator

    ids = None if draft_vocab is None else torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[
        :draft_vocab].sort().values
    vocab = DraftVocabulary(tiny_model.get_output_embeddings(), ids)
    stages = random_weights(SharedVocabMLPSpeculator(HIDDEN, 3), seed=5, std=0.1).double()
    stages.attach_embedding(tiny_model.get_input_embeddings())
    write_ibm_layout(stages, vocab, tmp_path / "ibm", torch.float32)
    ours = MLPSpeculatorDrafter(tiny_model, heads=stages, vocab=vocab)
    converted = MLPSpeculatorDrafter(tiny_model, checkpoint=str(tmp_path / "ibm"))
    assert converted.top_k == ours.top_k and converted.n_candidates == ours.n_candidates
    h, root, candidates = first_candidates(tiny_model, ours)
    assert first_candidates(tiny_model, converted)[2] == candidates
    tokens = torch.tensor([root, *candidates[0][:-1]])
    torch.testing.assert_close(stage_probs(converted, h, tokens), stage_probs(ours, h, tokens), atol=1e-6, rtol=1e-4)


def stage_probs(drafter: MLPSpeculatorDrafter, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each stage's next-token distribution over the whole vocabulary ([n_predict, vocab]), stage i conditioned on
    tokens[i]."""
    state, probs = drafter.stages.first_state(h[None]), []
    with torch.inference_mode():
        for stage, token in enumerate(tokens):
            state = drafter.stages.advance(stage, state, token[None])
            logits = drafter.stages.logits(stage, state, drafter.vocab)
            probs.append(drafter.vocab.full_probs(torch.softmax(logits, dim=-1))[0])
    return torch.stack(probs)


@pytest.mark.real_model
def test_committed_mlp_speculator_is_lossless_on_smollm2_as_a_chain_and_with_its_tree():
    chain = assert_lossless_on_smollm2("mlp_speculator", category="writing", count=2)  # SmolLM2's CPU setting
    tree = assert_lossless_on_smollm2("mlp_speculator", "method.drafter.top_k_tokens_per_head=null",
                                      "method.drafter.n_candidates=null", category="writing", count=2)
    assert 1.2 < chain < tree and tree > 1.3  # the checkpoint's [5, 4, 3] x 5 candidates accept more


def test_the_convert_command_writes_ibm_layout_of_a_saved_checkpoint(tiny_checkpoint, tmp_path, capsys):
    from bench.config import compose_config
    from bench.convert import main
    from bench.models import load_model
    from methods.heads.common import save_heads
    from methods.mlp_speculator.head import SharedVocabMLPSpeculator
    from tests.conftest import tiny_overrides

    overrides = tiny_overrides(tiny_checkpoint, tmp_path / "run")
    target, _ = load_model(compose_config(*overrides).model, torch.device("cpu"))
    stages = random_weights(SharedVocabMLPSpeculator(HIDDEN, 2), seed=6, std=0.1)
    save_heads(tmp_path / "ours", {"specbench_method": "mlp_speculator", "n_predict": 2, "scale_input": False,
                                   "top_k_tokens_per_head": [3, 2], "n_candidates": 4}, stages.state_dict(), {})
    main(["mlp_speculator", str(tmp_path / "ours"), str(tmp_path / "ibm"), *overrides])
    assert "IBM's accelerator layout" in capsys.readouterr().out
    config = json.loads((tmp_path / "ibm" / "config.json").read_text())
    assert (config["inner_dim"], config["top_k_tokens_per_head"], config["torch_dtype"]) == (HIDDEN + 1, [3, 2],
                                                                                           "float16")
    ours = MLPSpeculatorDrafter(target, checkpoint=str(tmp_path / "ours"))
    converted = MLPSpeculatorDrafter(target, checkpoint=str(tmp_path / "ibm"))
    hidden = torch.randn(1, HIDDEN, dtype=target.dtype, generator=torch.Generator().manual_seed(0))
    for drafter in (ours, converted):
        drafter.start([1, 2], hidden=hidden)
    assert converted.candidates(7, 2).tolist() == ours.candidates(7, 2).tolist()
