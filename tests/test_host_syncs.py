"""Host syncs of the timed decode loop, counted on the CPU path by tests/sync_counter.py (see its definition: reads of
tensor data by this project's code, and blocking host-to-device copies; prefill excluded, counted per step).

Greedy decoding needs one per step: the host must learn the target's argmax to accept a path. Vanilla, PLD and
Medusa make exactly that one (Medusa's draft tokens ride along in the same copy); under sampling the target's
probabilities of the step's tree rows come to the host in one copy, with the draft's probabilities beside them.
"""
from __future__ import annotations

import pytest
import torch

from bench.engine.acceptance import host_with_drafts
from bench.engine.batched import BatchedEngine
from bench.engine.drafter import Drafter
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig, pick_token
from bench.engine.tree import DeviceTokens, DraftTree
from methods.heads.common import DraftVocabulary
from methods.medusa.drafter import MedusaDrafter
from methods.pld import PromptLookupDrafter
from tests.conftest import VOCAB, vanilla_tokens
from tests.sync_counter import SyncCounter, count_decode_steps, count_per_step
from tests.test_medusa import random_heads

T08 = SamplingConfig(temperature=0.8)
REPEATING = [5, 9, 3, 7, 1, 5, 9, 3, 7, 1, 5, 9, 3]  # PLD finds n-gram matches in it


def medusa(model, seed: int = 0, vocab_slice: bool = False) -> MedusaDrafter:
    vocab = DraftVocabulary(model.get_output_embeddings(), torch.arange(0, VOCAB, 2) if vocab_slice else None)
    return MedusaDrafter(model, choices="mc_sim_7b_63", tree_size=16, heads=random_heads(64, seed=seed), vocab=vocab)


class RandomChainDrafter(Drafter):
    """Proposes 3 random tokens with random draft probabilities (on the model's device), as a sampled draft does."""

    def __init__(self, model):
        self.device, self.generator = model.device, torch.Generator().manual_seed(0)

    def start(self, prompt_ids):
        pass

    def propose(self, context, max_tokens):
        probs = torch.rand(3, VOCAB, generator=self.generator, dtype=torch.float64).softmax(-1)
        tokens = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
        return DraftTree.chain(tokens.tolist(), probs.to(self.device))

    def update(self, step):
        pass


def test_the_counter_counts_project_code_only(tiny_model):
    counter = SyncCounter()
    logits = torch.randn(VOCAB)
    with counter.patched():
        counter.counting = True
        pick_token(logits, SamplingConfig(), None)  # int(argmax) in bench/engine/loop.py: counted
        logits.argmax().item()  # here in a test file: not counted
    assert dict(counter.kinds) == {"__int__": 1}
    pick_token(logits, SamplingConfig(), None)  # unpatched once the block is left
    assert counter.total == 1


def test_vanilla_greedy_makes_one_host_sync_per_token(tiny_model, prompts, one_thread):
    out, steps, _ = count_decode_steps(SpeculativeEngine(tiny_model), prompts[1], StopCondition(30))
    assert len(steps) == len(out.tokens) - 1 == 29  # the first token comes from prefill
    assert steps == [1] * 29


def test_pld_greedy_makes_one_host_sync_per_step(tiny_model, one_thread):
    out, steps, _ = count_decode_steps(SpeculativeEngine(tiny_model, PromptLookupDrafter(tiny_model)), REPEATING,
                                       StopCondition(30))
    assert out.tokens == vanilla_tokens(tiny_model, REPEATING, 30)
    assert max(out.verified_tokens) > 1 and min(out.verified_tokens) == 1  # drafted steps and plain ones
    assert steps == [1] * (out.decode_steps)


@pytest.mark.parametrize("vocab_slice", [False, True])
def test_medusa_greedy_makes_one_host_sync_per_step(tiny_model, prompts, vocab_slice, one_thread):
    """The tree's mask and positions live on the device from the first step on; the draft tokens come to the host
    with the acceptance argmax."""
    out, steps, counter = count_decode_steps(SpeculativeEngine(tiny_model, medusa(tiny_model, 1, vocab_slice)),
                                             prompts[2], StopCondition(40))
    assert out.tokens == vanilla_tokens(tiny_model, prompts[2], 40)
    assert max(out.verified_tokens) == 17 and len(steps) == out.decode_steps
    assert steps == [1] * len(steps) and set(counter.kinds) <= {"tolist", "__int__"}  # __int__: an undrafted step


def test_medusa_greedy_with_sliding_window_makes_one_host_sync_per_step(windowed_model, prompts, one_thread):
    out, steps, _ = count_decode_steps(SpeculativeEngine(windowed_model, medusa(windowed_model)), prompts[1],
                                       StopCondition(30))
    assert out.tokens == vanilla_tokens(windowed_model, prompts[1], 30)
    assert steps == [1] * len(steps)


@pytest.mark.parametrize("method", ["vanilla", "pld", "medusa", "draft_probs"])
def test_sampling_copies_the_step_probabilities_to_the_host_once(tiny_model, method, one_thread):
    """One `.cpu()` per step, whatever the tree and however deep it is accepted; no host-to-device copy; every other
    read is of those host tensors (acceptance's own arithmetic) or Medusa's tokens."""
    drafter = {"vanilla": lambda: None, "pld": lambda: PromptLookupDrafter(tiny_model),
               "medusa": lambda: medusa(tiny_model), "draft_probs": lambda: RandomChainDrafter(tiny_model)}[method]()
    engine = SpeculativeEngine(tiny_model, drafter, T08)
    out, steps, counter = count_per_step(lambda: engine.generate(REPEATING, StopCondition(30), seed=0),
                                         engine.drafter, "propose")
    assert counter.kinds["cpu"] == len(steps) == out.decode_steps
    assert max(out.verified_tokens) > 1 or method == "vanilla"
    host_reads = {site.split(":")[0] for site in counter.sites if " cpu" not in site and " tolist" not in site}
    assert host_reads <= {"bench/engine/acceptance.py", "bench/engine/sampling.py"}
    assert counter.kinds["tolist"] <= (len(steps) if method == "medusa" else 0)  # Medusa: its tokens, once a step
    assert not {"to(device)", "tensor(device=)", "cuda"} & set(counter.kinds)


@pytest.mark.parametrize("method", ["vanilla", "medusa"])
@pytest.mark.parametrize("sampling", [SamplingConfig(), T08])
def test_batched_step_reads_the_device_once(tiny_model, prompts, method, sampling, one_thread):
    drafter = None if method == "vanilla" else medusa(tiny_model)
    engine = BatchedEngine(tiny_model, drafter, sampling)
    out, steps, counter = count_per_step(lambda: engine.generate(prompts, StopCondition(20), [0, 1, 2]), engine,
                                         "_propose")
    if sampling.greedy:
        assert [t.tokens for t in out.turns] == [vanilla_tokens(tiny_model, p, 20) for p in prompts]
        assert steps == [1] * len(steps)
    else:
        assert counter.kinds["cpu"] == len(steps)
    assert not {"to(device)", "tensor(device=)", "cuda"} & set(counter.kinds)


def test_device_tokens_come_to_the_host_with_the_acceptance_copy():
    template = DraftTree([0, 0, 0], [-1, 0, -1])
    tree = template.with_tokens(DeviceTokens(torch.tensor([4, 5, 6])))
    assert tree.tokens_on_device and len(tree) == 3 and tree.local_mask.shape == (4, 4)
    cut = tree.tokens[:2]
    assert isinstance(cut, DeviceTokens) and not cut.on_host  # a cut tree stays on the device
    counter = SyncCounter()
    with counter.patched():
        counter.counting = True
        target = host_with_drafts(torch.tensor([4, 5, 9, 9]), [tree, None])
        assert tree.tokens == [4, 5, 6] and not tree.tokens_on_device
    assert target == [4, 5, 9, 9] and counter.total == 1
    assert tree.input_ids(7, torch.device("cpu")).tolist() == [7, 4, 5, 6]


def test_trees_of_one_shape_share_their_device_layout():
    template = DraftTree([0, 0, 0], [-1, 0, -1])
    first = template.with_tokens([1, 2, 3]).on_device(torch.device("cpu"))
    second = template.with_tokens(DeviceTokens(torch.tensor([4, 5, 6]))).on_device(torch.device("cpu"))
    assert all(a is b for a, b in zip(first, second))
    assert first[1].tolist() == [0, 1, 2, 1]
