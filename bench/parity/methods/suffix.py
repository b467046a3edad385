"""SuffixDecoding beside arctic-inference 0.3.0's own suffix tree (its compiled SuffixTree through
SuffixDecodingCache, as vLLM's `suffix` proposer calls it; sides/arctic_driver.py), at vLLM's defaults
(conf/method/suffix.yaml). It drafts without a model, so both sides are also fed the same steps without one
(arctic_driver.simulate: the target's greedy answer decides what is accepted) and their drafts compared step by step
(the notes); our #MAT is still our engine's, one drafter through the prompts in order (the global tree learns across
them, as a vLLM server's does). Rows: vLLM's defaults (a chain), use_tree_spec, and carry_over=false beside
upstream's max_cached_requests=1."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from bench.engine.loop import SpeculativeEngine
from bench.parity.environments import SideEnvironment
from bench.parity.protocol import Comparison, Setup, counted_outputs, knob_text, sequential_outputs
from bench.parity.sides.arctic_driver import simulate

AGAINST = "arctic-inference 0.3.0"
# arctic-inference is a source distribution: its suffix tree is compiled on install (C++20, cmake, ninja, nanobind;
# this machine's torch, cmake, ninja and g++), with the build isolation off so that it builds against this
# machine's torch. Its other dependencies (vLLM, gRPC for its embedding server) are not used by its suffix tree.
ARCTIC = SideEnvironment("arctic-venv", ("arctic-inference==0.3.0",), build=("nanobind==2.9.2", "wheel"))
# (label, ours, upstream's): knobs beside the composed ones
ROWS = (("vLLM's defaults, a chain", {}, {}),
        ("use_tree_spec=true", {"use_tree_spec": True}, {"use_tree_spec": True}),
        ("carry_over=false vs max_cached_requests=1", {"carry_over": False}, {"max_cached_requests": 1}))


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    knobs = {key: value for key, value in setup.knobs("suffix").items() if key != "carry_over"}  # arctic's knobs
    answers = [SpeculativeEngine(setup.model).generate(p, setup.stop).tokens for p in setup.prompts]
    runs = [{"method": "suffix", "knobs": {**knobs, **theirs}} for _, _, theirs in ROWS]
    upstream = ARCTIC.runs("arctic_driver", {**setup.side_job(), "answers": answers}, runs, work)
    rows = []
    for (label, ours, theirs), their_runs in zip(ROWS, upstream):
        make_drafter = setup.drafter("suffix", **ours)
        drafts = simulated_drafts(make_drafter, setup.prompts, answers, setup.stop.max_new_tokens)
        note = f"suffix, {label}: drafts equal at {draft_agreement(drafts, [r['drafts'] for r in their_runs])}"
        rows.append(Comparison("suffix", f"{label}: ours {knob_text(ours) or 'at the defaults'} vs arctic-inference "
                               f"0.3.0 SuffixDecodingCache {knob_text(theirs) or 'at the defaults'}",
                               counted_outputs(setup, sequential_outputs(setup, make_drafter, warmup=0)),
                               [(r["tokens"], r["steps"]) for r in their_runs], [note]))
    return rows


def simulated_drafts(make_drafter, prompts: list[list[int]], answers: list[list[int]], max_new_tokens: int) -> list:
    """Our drafter through arctic_driver.simulate (the upstream side's steps): its drafts, per prompt and step."""
    drafter = make_drafter()

    def draft(context: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
        tree = drafter.propose(context, max_tokens)
        return (list(tree.tokens), list(tree.parents)) if tree is not None else ([], [])

    def accept(tokens: list[int]) -> None:
        drafter.update(SimpleNamespace(acceptance=SimpleNamespace(tokens=tokens)))

    drafts = []
    for prompt, answer in zip(prompts, answers):
        drafter.start(prompt)
        drafts.append(simulate(prompt, answer, max_new_tokens, draft, accept)["drafts"])
    return drafts


def draft_agreement(ours: list, theirs: list) -> str:
    """How many steps drafted alike, and where the first that did not is."""
    pairs = [(p, s, a, b) for p, (mine, other) in enumerate(zip(ours, theirs)) for s, (a, b) in
             enumerate(zip(mine, other))]
    equal = sum(a == b for _, _, a, b in pairs)
    first = next((f" (first difference: prompt {p}, step {s}: ours {a}, upstream {b})" for p, s, a, b in pairs
                  if a != b), "")
    return f"{equal} of {len(pairs)} steps{first}"
