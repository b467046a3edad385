"""One head, two engines (python -m bench.parity.engines): per head, the overrides that run it as a chain of k
drafts in our engine and the vLLM server that runs the same head or draft. Plain data, no torch: the report
(bench/report/step_cost.py) pairs the cross-engine record's runs with it."""
from __future__ import annotations

# Per head: our engine's method as a chain of k drafts, and the vLLM server loading the same head or draft. EAGLE's
# tree knobs count as upstream's do: total_token verified tokens with the root (k drafts: k + 1), levels 1 + depth.
HEADS = {
    "eagle3": (["method=eagle3", "method.drafter.depth={k_minus_1}", "method.drafter.top_k=1",
                "method.drafter.total_token={k_plus_1}"],
               ["backend=server", "server=vllm_cpu_eagle3", "server.num_speculative_tokens={k}"]),
    "sps": (["method=sps", "method.drafter.num_draft_tokens={k}", "method.drafter.adaptive=false"],
            ["backend=server", "server=vllm_cpu_draft", "server.num_speculative_tokens={k}"]),
    # PLD as vLLM's ngram proposer drafts: the longest 1-3-gram match, its earliest occurrence, k tokens after it
    "pld": (["method=pld", "method.drafter.num_pred_tokens={k}", "method.drafter.match=first"],
            ["backend=server", "server=vllm_cpu_ngram", "server.num_speculative_tokens={k}"]),
    "pard": (["method=pard", "method.drafter.num_draft_tokens={k}"],
             ["backend=server", "server=vllm_cpu_pard", "server.num_speculative_tokens={k}"]),
    # DFlash: a block of k + 1 (the root and k masks), our drafter on the published copy vLLM loads (whole vocabulary)
    "dflash": (["method=dflash", "method.drafter.checkpoint={dflash_published}",
                "method.drafter.block_size={k_plus_1}"],
               ["backend=server", "server=vllm_cpu_dflash", "server.draft={dflash_published}",
                "server.num_speculative_tokens={k}"]),
    # SuffixDecoding drafts up to k tokens, a chain, from its trees (vLLM's default k for it: 24, its tree depth).
    # No warm-up on either side: vLLM's global tree would keep the warm-up request's answer, ours drops it.
    "suffix": (["method=suffix", "method.drafter.num_speculative_tokens={k}", "method.drafter.use_tree_spec=false",
                "warmup_tokens=0"],
               ["backend=server", "server=vllm_cpu_suffix", "server.num_speculative_tokens={k}", "warmup_tokens=0"]),
}
ENGINES = ("ours", "vllm")


def vllm_server(head: str) -> str:
    """The name of the vLLM server config (conf/server/<name>.yaml) that runs `head`: its runs' method name."""
    return next(o.split("=", 1)[1] for o in HEADS[head][1] if o.startswith("server="))
