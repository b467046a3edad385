"""PARD (methods/pard/): upstream's training layout, one draft forward per K tokens over the context's real tokens
only, strict PARD-layout loading, lossless greedy decoding (batch 1, batched, sizing=auto), training."""
from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoConfig, AutoModelForCausalLM

from bench.artifacts import PROJECT_ROOT
from bench.engine.sampling import SamplingConfig
from bench.errors import InvalidArtifactError
from methods.pard.checkpoints import mark_parallel
from methods.pard.drafter import ParallelDraftDrafter, tiny_drafter
from methods.pard.layout import parallel_layout
from methods.sps.draft import save_draft, slice_target
from tests.conftest import tiny_config
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, assert_sizing_auto_run_lossless
from tests.test_checkpoints import assert_one_line_refusal
from tests.test_head_training import corpus  # noqa: F401 (a fixture)

MASK = 3


def collator_mask(seq_len: int, num_blocks: int) -> torch.Tensor:
    """[K*S, K*S] bool: upstream's `pard_train.py` collator's attention rule over all K blocks (True: attend), as
    its index arithmetic states it: itself, the key i*(S+1) places back for every block count i, and, for a
    query in block j <= i, keys before its own index minus i*S + i - 1."""
    n = seq_len * num_blocks
    index = torch.arange(n)
    query, key = index[:, None], index[None, :]
    allowed = key == query
    for i in range(num_blocks):
        allowed |= key == query - seq_len * i - i
        allowed |= (key < query - i * seq_len - (i - 1)) & (query < (i + 1) * seq_len)
    return allowed


@pytest.mark.parametrize("seq_len, num_blocks", [(7, 4), (12, 8), (5, 1)])
def test_the_layout_attends_as_upstreams_collator(seq_len, num_blocks):
    """Over every position that has a real prefix (block k's positions p >= k; upstream keeps the others but never
    labels them), the layout's attention is upstream's, and its tokens are the sequence then masks."""
    layout = parallel_layout(seq_len, num_blocks)
    flat = layout.block * seq_len + layout.position
    assert torch.equal(layout.attention(), collator_mask(seq_len, num_blocks)[flat][:, flat])
    assert layout.block.tolist() == [k for k in range(num_blocks) for _ in range(k, seq_len)]
    ids = torch.arange(100, 100 + seq_len)[None]
    assert layout.input_ids(ids, MASK).tolist() == [[100 + p if k == 0 else MASK for k, p in
                                                     zip(layout.block.tolist(), layout.position.tolist())]]


def test_conditional_drop_keeps_upstreams_counts_and_every_masks_parent():
    layout = parallel_layout(256, 8, 0.7, 0.2, torch.Generator().manual_seed(1))
    counts = [int((layout.block == k).sum()) for k in range(8)]
    assert counts == [256] + [int(256 * max(0.7 ** k, 0.2)) for k in range(1, 8)]
    kept = set(zip(layout.block.tolist(), layout.position.tolist()))
    assert all((k - 1, p - 1) in kept and p >= k for k, p in kept if k > 0)


def test_one_forward_drafts_k_tokens_and_the_cache_keeps_real_tokens_only(tiny_model, one_thread):
    """Every proposal equals the argmax of an uncached draft forward over context + K-1 masks, and after it the
    draft's cache holds exactly the context (the masks' entries dropped, drafts never written)."""
    drafter = tiny_drafter(tiny_model, SamplingConfig(), {"num_draft_tokens": 4}, None)
    calls = []
    propose = drafter.propose

    def checked(context, max_tokens):
        tree = propose(context, max_tokens)
        n = len(tree)
        ids = torch.tensor([context + [MASK] * (n - 1)])
        expected = drafter.draft(input_ids=ids).logits[0, -n:].argmax(-1).tolist()
        calls.append((tree.tokens == expected, drafter.network.length == len(context)))
        return tree

    drafter.propose = checked
    out = assert_lossless(tiny_model, drafter, [5, 17, 3, 40, 9, 12], 30)
    assert len(calls) > 3 and all(a and b for a, b in calls)
    assert max(out.accept_lengths) >= 2  # some drafts were accepted, so the cache saw accepted tokens come in


@pytest.mark.parametrize("k", [1, 2, 5, 12])
def test_greedy_pard_equals_vanilla(tiny_model, prompts, k, one_thread):
    for prompt in prompts:
        assert_lossless(tiny_model, tiny_drafter(tiny_model, SamplingConfig(), {"num_draft_tokens": k}, None),
                        prompt, 25)


def write_pard_checkpoint(folder, vocab_size: int, **fields):
    """A PARD-layout draft as amd/PARD-* ships one: a standard one-layer Llama causal LM folder (own embedding and
    LM head) whose config.json adds `fields` (default pard_token=MASK, spd_type=pard)."""
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(tiny_config(num_hidden_layers=1, vocab_size=vocab_size))
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(fields or {"pard_token": MASK, "spd_type": "pard"})
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return folder


def test_a_pard_layout_checkpoint_loads_and_decodes_losslessly(tiny_model, tmp_path, one_thread):
    folder = write_pard_checkpoint(tmp_path / "pard", tiny_model.config.vocab_size)
    drafter = ParallelDraftDrafter(tiny_model, draft_path=str(folder), num_draft_tokens=4)
    assert drafter.mask_token_id == MASK and drafter.artifact is not None
    assert_lossless(tiny_model, drafter, [5, 17, 3, 40, 9, 12], 20)
    vllms = write_pard_checkpoint(tmp_path / "ptd", tiny_model.config.vocab_size, ptd_token_id=7)
    assert ParallelDraftDrafter(tiny_model, draft_path=str(vllms)).mask_token_id == 7


@pytest.mark.parametrize("fields, fragments", [
    ({"spd_type": "pard"}, ["is not a PARD draft", "no integer pard_token", "python -m bench.train method=pard"]),
    ({"pard_token": "3"}, ["is not a PARD draft", "found '3'"]),
    ({"pard_token": 500}, ["pard_token=500, outside its vocabulary of 96 tokens", "amd/PARD-*"]),
])
def test_a_checkpoint_without_a_usable_mask_token_is_refused_in_one_line(tiny_model, tmp_path, fields, fragments):
    folder = write_pard_checkpoint(tmp_path / "bad", tiny_model.config.vocab_size, **fields)
    with pytest.raises(InvalidArtifactError) as error:
        ParallelDraftDrafter(tiny_model, draft_path=str(folder))
    assert_one_line_refusal(error, *fragments)


def test_a_draft_of_another_vocabulary_is_refused_in_one_line(tiny_model, tmp_path):
    folder = write_pard_checkpoint(tmp_path / "other", 200)
    with pytest.raises(InvalidArtifactError) as error:
        ParallelDraftDrafter(tiny_model, draft_path=str(folder))
    assert_one_line_refusal(error, "a vocabulary of 200 tokens, the target 96")


def pard_train_config(checkpoint, corpus, tmp_path):  # noqa: F811 (corpus: the fixture's value)
    """conf/train.yaml for method=pard on the tiny checkpoint, from an SpS draft of its first layer."""
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[
            "method=pard", f"model.path={checkpoint}", "model.gguf_file=null", "model.package=null",
            "model.name=tiny", f"features.corpus={corpus}", "features.seq_len=32", "features.num_sequences=8",
            "features.shard_sequences=2", f"features.dir={tmp_path / 'features'}", "train.max_steps=3",
            "train.eval_every=2", "train.batch_size=2", f"train.checkpoint={tmp_path / 'resume.pt'}",
            f"train.init_draft={tmp_path / 'sps'}", f"method.drafter.draft_path={tmp_path / 'pard'}",
            "train.recipe.num_blocks=3", f"train.recipe.mask_token_id={MASK}"])


def test_train_pard_writes_a_pard_draft_its_drafter_loads(tiny_checkpoint, corpus, tmp_path,  # noqa: F811
                                                          one_thread):
    from bench.models import load_model
    from methods.heads.settings import TrainingRun
    from methods.heads.training import train_heads
    from methods.pard.train import PardRecipe

    cfg = pard_train_config(tiny_checkpoint, corpus, tmp_path)
    target, _ = load_model(cfg.model, torch.device("cpu"))
    save_draft(slice_target(target, [0]), tmp_path / "sps", {})
    out_dir = train_heads(TrainingRun.from_config(cfg), PardRecipe(mask_token_id=MASK, num_blocks=3))
    card = json.loads((out_dir / "card.json").read_text())
    assert card["method"] == "pard" and [h["depth"] for h in card["heldout_agreement"]] == [1, 2, 3]
    config = AutoConfig.from_pretrained(out_dir)
    assert (config.pard_token, config.spd_type, config.specbench_target_layers) == (MASK, "pard", [0])
    cfg.model.dtype = "float64"
    target, _ = load_model(cfg.model, torch.device("cpu"))
    assert_lossless(target, ParallelDraftDrafter(target, draft_path=str(out_dir), num_draft_tokens=4),
                    [5, 6, 7, 8, 9, 10], 20)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_runs_with_a_pard_checkpoint_and_sizing_auto_are_lossless(compose, tiny_checkpoint, tmp_path, batch_size,
                                                                  one_thread):

    folder = write_pard_checkpoint(tmp_path / "pard", AutoConfig.from_pretrained(tiny_checkpoint).vocab_size)
    assert_sizing_auto_run_lossless(compose, tmp_path, "pard", batch_size, f"method.drafter.draft_path={folder}")


def test_the_published_pair_for_gpu_users_is_llama31_with_amds_pard_draft():
    from bench.config import compose_config

    cfg = compose_config("method=pard", "model=llama31_8b")
    assert cfg.model.path == "meta-llama/Llama-3.1-8B-Instruct"
    assert (cfg.method.drafter.draft_path, cfg.method.drafter.num_draft_tokens) == ("amd/PARD-Llama-3.2-1B", 12)


def test_mark_parallel_writes_upstreams_fields():
    config = tiny_config()
    mark_parallel(config, 5)
    assert (config.pard_token, config.spd_type) == (5, "pard")


@pytest.mark.real_model
def test_committed_pard_draft_is_lossless_on_smollm2():
    mean_accepted = assert_lossless_on_smollm2("pard", category="writing", count=2)
    assert mean_accepted > 1.0
