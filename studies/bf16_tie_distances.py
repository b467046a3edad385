"""How far from float32's top logit the tokens at bfloat16 divergences lie: the measurement behind the bfloat16
models' `tie_margin` (docs/bfloat16.md).

    python -m studies.bf16_tie_distances [--methods pld,eagle2,medusa] [--skip 5] [--per-task 4]

Each method (lossless in float32: exact_match 1.000 on every task) and vanilla decode the same Spec-Bench first
turns greedily in bfloat16; at each first divergence a float32 copy of the target scores the two tokens at the
shared prefix (bench.measure.exactness.find_divergence). Every divergence here is a bfloat16 tie by construction, so
the largest float32 distance seen is what a numeric tie can look like; a broken drafter's divergences lie far
beyond it. Questions: the `--per-task` after the first `--skip` of each task (the reference runs use the first 5).
Counts only, no timing: any machine load is fine. Prints one line per divergence and a summary.
"""
from __future__ import annotations

import argparse
import json
import math

import torch
from tqdm import tqdm

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.assemble import build_drafter
from bench.measure.exactness import find_divergence
from bench.models import eos_token_ids, load_check_model, load_model
from bench.settings import drafter_settings
from tasks import first_turn_prompts, read_questions, task_of


def questions_after(skip: int, per_task: int) -> list[dict]:
    """The `per_task` questions after the first `skip` of each task, in file order."""
    seen: dict[str, int] = {}
    chosen = []
    for question in read_questions(None):
        task = task_of(question["category"])
        index = seen.get(task, 0)
        seen[task] = index + 1
        if skip <= index < skip + per_task:
            chosen.append(question)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m studies.bf16_tie_distances", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m_bf16")
    parser.add_argument("--methods", default="pld,eagle2,medusa")
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--per-task", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None, help="also write the divergences as JSON lines here")
    args = parser.parse_args()
    cfg = compose_config(f"model={args.model}", "+model.allow_slow_bfloat16=true")
    device = torch.device("cpu")
    model, tokenizer = load_model(cfg.model, device)
    judge = load_check_model(cfg.model, device, cfg.model.tie_check_dtype)
    greedy = SamplingConfig(0.0, 0, 1.0)
    stop = StopCondition(args.max_new_tokens, frozenset(eos_token_ids(model, tokenizer)))
    vanilla = SpeculativeEngine(model, None, greedy)
    questions = questions_after(args.skip, args.per_task)
    prompts = first_turn_prompts(tokenizer, questions)
    references = [vanilla.generate(p, stop).tokens for p in tqdm(prompts, desc="vanilla bf16")]
    found = []
    for name in args.methods.split(","):
        method_cfg = compose_config(f"model={args.model}", "+model.allow_slow_bfloat16=true", f"method={name}").method
        engine = SpeculativeEngine(model, build_drafter(drafter_settings(method_cfg), model, tokenizer, greedy), greedy)
        for question, prompt, reference in zip(tqdm(questions, desc=f"{name} bf16"), prompts, references):
            tokens = engine.generate(prompt, stop).tokens
            divergence = find_divergence(model, [{"token_ids": tokens, "prompt_ids": prompt}],
                                         {"choices": [{"token_ids": [reference]}]}, math.inf, judge)
            if divergence is not None:
                found.append({"method": name, "question_id": question["question_id"], **divergence})
                print(json.dumps(found[-1]))
    distances = sorted(d["tie_distance"] for d in found if math.isfinite(d["logit_gap"]))
    print(f"\n{len(found)} divergences over {len(questions)} questions x {args.methods}; float32 tie distance: "
          + (f"median {distances[len(distances) // 2]:.4f}, max {distances[-1]:.4f}" if distances else "none"))
    print(f"stop-rule divergences (one output ended earlier): {sum(not math.isfinite(d['logit_gap']) for d in found)}")
    if args.out:
        with open(args.out, "w") as out:
            out.writelines(json.dumps(d) + "\n" for d in found)


if __name__ == "__main__":
    main()
