"""The upstream side of the suffix parity file (bench/parity/methods/suffix.py): arctic-inference 0.3.0's
SuffixDecodingCache, run in its side virtual environment, never in the project's (it imports nothing of the project),
driven as vLLM's `suffix` proposer drives it (vllm/v1/spec_decode/suffix_decoding.py):

    <venv>/bin/python bench/parity/sides/arctic_driver.py JOB.json OUT.json

SuffixDecoding drafts without a model, so no model runs here: each prompt's answer (the target's greedy tokens,
`answers` in JOB.json, the same for every lossless method) stands in for the target. Per prompt, one request:
start_request(prompt); the prefill's token, then each step's accepted tokens and the target's next one, go to
add_active_response; each step speculates after the context's last max_tree_depth tokens, at most
min(num_speculative_tokens, what the turn still takes - 1) tokens, and accepts the longest drafted path that the
answer follows (greedy verification). The requests share one cache, in prompt order, as a vLLM server's do.

JOB.json: {"max_new_tokens", "prompts": [[ids]], "answers": [[ids]], "runs": [{"name", "method": "suffix",
"knobs": {max_tree_depth, num_speculative_tokens, max_spec_factor, max_spec_offset, min_token_prob, use_tree_spec,
max_cached_requests}}]}; OUT.json: per run name, per prompt {"tokens", "steps" (target forwards, the prefill
included), "drafts": [[token_ids, parents] per step]}.

`simulate` is the loop, shared with the project side (the suffix parity file runs our drafter through it too), so
that the two sides' drafts are compared step by step on the same contexts.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable


def accepted_length(tokens: list[int], parents: list[int], follows: list[int]) -> int:
    """Greedy verification: the depth of the longest drafted path whose tokens are `follows`' first ones."""
    depth, node = 0, -1
    while depth < len(follows):
        node = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == follows[depth]), None)
        if node is None:
            break
        depth += 1
    return depth


def simulate(prompt: list[int], answer: list[int], max_new_tokens: int,
             draft: Callable[[list[int], int], tuple[list[int], list[int]]],
             accept: Callable[[list[int]], None]) -> dict:
    """One turn: `draft(context, max_tokens)` -> (tokens, parents) each step, `accept(tokens)` with the prefill's
    token and then each step's accepted tokens plus the target's next one (answer's)."""
    accept(answer[:1])
    known, steps, drafts = 1, 1, []
    while known < len(answer):
        tokens, parents = draft(prompt + answer[:known], max_new_tokens - known)
        drafts.append([list(tokens), list(parents)])
        taken = accepted_length(tokens, parents, answer[known:]) + 1
        accept(answer[known : known + taken])
        known, steps = known + taken, steps + 1
    return {"tokens": answer, "steps": steps, "drafts": drafts}


def run_suffix(job: dict, run: dict) -> list[dict]:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    knobs = run["knobs"]
    depth, limit = knobs["max_tree_depth"], knobs["num_speculative_tokens"]
    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=knobs["max_cached_requests"])
    results = []
    for request, (prompt, answer) in enumerate(zip(job["prompts"], job["answers"])):
        cache.start_request(request, prompt)

        def draft(context: list[int], max_tokens: int, request=request) -> tuple[list[int], list[int]]:
            out = cache.speculate(request, context[-depth:], max_spec_tokens=min(limit, max_tokens - 1),
                                  max_spec_factor=knobs["max_spec_factor"], max_spec_offset=knobs["max_spec_offset"],
                                  min_token_prob=knobs["min_token_prob"], use_tree_spec=knobs["use_tree_spec"])
            return list(out.token_ids), list(out.parents)

        results.append(simulate(prompt, answer, job["max_new_tokens"], draft,
                                lambda tokens, request=request: cache.add_active_response(request, tokens)))
        cache.stop_request(request)
    return results


RUNNERS = {"suffix": run_suffix}


def main() -> None:
    job = json.load(open(sys.argv[1]))
    json.dump({run["name"]: RUNNERS[run["method"]](job, run) for run in job["runs"]}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
