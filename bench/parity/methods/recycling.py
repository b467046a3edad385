"""Token Recycling beside Spec-Bench's own runner (evaluation/inference_recycling.py, sides/spec_bench_driver.py).
Upstream keeps one matrix across prompts, so both sides decode Spec-Bench's sequence through one drafter (its
warm-up, both turns of the first question 3 times, not counted, then the prompts): ours with the matrix carried over
as upstream, and with a fresh one per turn."""
from __future__ import annotations

from pathlib import Path

from bench.parity.environments import SPEC_BENCH, SPEC_BENCH_CHECKOUT, SPEC_BENCH_WARMUP
from bench.parity.protocol import Comparison, Setup, counted_outputs, knob_text, sequential_outputs

AGAINST = "Spec-Bench's inference_recycling"


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    knobs = setup.knobs("recycling")
    run = {"method": "recycling", "output_id_topk": knobs["k"], "tree_version": knobs["template"],
           "warmup": SPEC_BENCH_WARMUP}
    job = {**setup.side_job(), "spec_bench": str(SPEC_BENCH_CHECKOUT.path(setup.checkouts))}
    [theirs] = SPEC_BENCH.runs("spec_bench_driver", job, [run], work)
    rows = []
    for carry_over in (True, False):
        ours = sequential_outputs(setup, setup.drafter("recycling", carry_over=carry_over), SPEC_BENCH_WARMUP)
        shown = {"k": knobs["k"], "template": knobs["template"], "carry_over": carry_over}
        rows.append(Comparison("recycling", f"{knob_text(shown)} vs Spec-Bench inference_recycling --output-id-topk "
                               f"{knobs['k']} --tree_version {knobs['template']}", counted_outputs(setup, ours),
                               [(r["tokens"], r["steps"]) for r in theirs]))
    return rows
