"""ReDrafter beside apple/ml-recurrent-drafter's PyTorch code (`RecurrentDrafting.generate`, greedy;
sides/redrafter_driver.py): the same drafter, target and prompt ids at our beams (conf/method_model/redrafter) and
upstream's documented run (conf/method/redrafter.yaml). Our committed drafter is rewritten in upstream's layout
(methods/redrafter/checkpoints.py); upstream's own Llama loads the dequantized target. The notes: whether the first
proposal (the beams at the prompt's end) is equal, and at every position where both sides drafted full-length beams,
whether the whole beam tensor is; and once, the largest difference between the last hidden state of upstream's
prefill of the first prompt and ours."""
from __future__ import annotations

from pathlib import Path

import torch

from bench.engine.loop import SpeculativeEngine
from bench.parity.environments import Checkout, SideEnvironment, rope_theta
from bench.parity.protocol import Comparison, Setup, counted_output, generate_recording
from methods.redrafter.checkpoints import write_upstream_layout

AGAINST = "apple/ml-recurrent-drafter"
REDRAFTER = SideEnvironment("redrafter-upstream/venv", ("jsonlines==4.0.0", "tabulate==0.10.0"))
CHECKOUT = Checkout("redrafter", "redrafter-upstream", "recurrent_drafting/recurrent_drafting.py",
                    "git clone https://github.com/apple/ml-recurrent-drafter {dir}")


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    beams = [[knobs["beam_width"], knobs["beam_length"]] for knobs in (setup.knobs("redrafter"),
                                                                       setup.knobs("redrafter", upstream=True))]
    ours = setup.drafter("redrafter")()
    drafter_dir = work / "upstream-layout"
    write_upstream_layout(ours.drafter, ours.vocab, drafter_dir)
    job = {**setup.side_job(), "checkout": str(CHECKOUT.path(setup.checkouts)), "drafter_dir": str(drafter_dir),
           "theta": rope_theta(setup.model.config), "beams": beams, "eos": setup.tokenizer.eos_token_id}
    upstream = REDRAFTER.run("redrafter_driver", job, work)
    with torch.inference_mode():  # the same target on both sides
        state = setup.model(input_ids=torch.tensor([setup.prompts[0]]),
                            output_hidden_states=True).hidden_states[-1][0, -1]
    hidden = ("redrafter: the last hidden state of the first prompt's prefill, upstream's Llama vs ours: max "
              f"|difference| {float((torch.tensor(upstream['hidden']) - state).abs().max()):.2e}")
    rows = []
    for width, length in beams:
        drafter = setup.drafter("redrafter", beam_width=width, beam_length=length)()
        engine = SpeculativeEngine(setup.model, drafter)
        mine = [our_run(engine, drafter, prompt, setup.stop) for prompt in setup.prompts]
        theirs = [{**r, "drafted": {int(p): beams for p, beams in r["drafted"].items()}}
                  for r in upstream["runs"][f"{width}x{length}"]]
        rows.append(Comparison("redrafter", f"beams {width} x {length} vs apple/ml-recurrent-drafter "
                               "RecurrentDrafting.generate greedy", [(t, f) for t, f, _ in mine],
                               [(r["tokens"], r["forwards"]) for r in theirs],
                               [beam_agreement(f"{width} x {length}", [d for *_, d in mine],
                                               [r["drafted"] for r in theirs])]))
    rows[0].notes.insert(0, hidden)
    return rows


def our_run(engine, drafter, prompt: list[int], stop) -> tuple[list[int], int, dict[int, list]]:
    """(tokens, target forwards until they were known, {new tokens known: the full-length beams drafted there}) of
    our engine."""
    out, drafted = generate_recording(engine, drafter, prompt, stop, "beams",
                                      keep=lambda length: length == drafter.beam_length)
    return (*counted_output(out, stop.max_new_tokens), drafted)


def beam_agreement(shape: str, ours: list[dict[int, list]], theirs: list[dict[int, list]]) -> str:
    """How many prompts' first beams are equal, and how many beams are where both sides drafted full-length ones
    (per prompt: {new tokens known: the beams drafted there})."""
    first = sum(mine.get(1) == other.get(1) for mine, other in zip(ours, theirs))
    both = [(mine[p], other[p]) for mine, other in zip(ours, theirs) for p in mine.keys() & other.keys()]
    return (f"redrafter {shape}: first beams equal {first}/{len(ours)}, beams equal where both drafted "
            f"{sum(a == b for a, b in both)}/{len(both)}")
