"""Parity check: our Lookahead, Medusa, EAGLE-1, SuffixDecoding and DFlash against the reference implementations on
the package index, our Token Recycling and SAM-Decoding against Spec-Bench's own runners, and our PARD and ReDrafter
against their authors' code.

    python -m benchmarks.vs_upstream [--methods lookahead,medusa,eagle,recycling,samd,suffix,pard,dflash,redrafter]
        [--questions 81,82] [--max-new-tokens 64] [--spec-bench DIR]

Both sides decode the same prompt token ids (MT-bench questions 81-82, both turns, turn 2 asked after vanilla's
turn-1 answer; our chat template), greedily in float32 on SmolLM2-135M (the dequantized GGUF folder that
bench/models.py makes, which both sides load), with the same settings: Lookahead W=15 N=5 G=15; Medusa with
medusa-llm 0.1's default tree (`medusa_choices=[1, 7, 6]`: top-7 of head 1 x top-6 of head 2, 49 nodes), ours given
the same nodes as a choices list; EAGLE-1 with eagle-llm's static tree (its `mc_sim_7b_63`, 25 nodes: our
`eagle_7b_25`). Our committed heads are converted to upstream's layout in a temp folder (see upstream_driver.py for
the vocabulary slice). Prints, per method: our and upstream's #MAT (tokens per target forward, the prefill
included), their relative difference, and whether the tokens are equal (else the first divergence).

Token Recycling and SAM-Decoding (its Token Recycling and EAGLE-2 fallbacks, as Spec-Bench's eval.sh sets SAMD:
n_predicts 40, len_threshold 5, len_bias 5, no static corpus) run from a checkout of hemingkx/Spec-Bench (--spec-bench,
default $SPECBENCH_CACHE/spec-bench) by benchmarks/spec_bench_driver.py. Their drafters keep state across prompts
upstream (one matrix; SAMD's recycling cache), so both sides decode Spec-Bench's sequence through one drafter
object: its warm-up (both turns of the first question, 3 times, not counted), then the prompts; our rows pass every
knob that shapes that state explicitly, and say so. SAMD's generate decodes one token past max_new_tokens, and its
recycling fallback learns from it: the samd[recycling] row does too (forwards counted until max_new_tokens).

SuffixDecoding runs arctic-inference 0.3.0's own suffix tree (its compiled SuffixTree, through SuffixDecodingCache, as
vLLM's `suffix` proposer calls it) by benchmarks/arctic_driver.py. It drafts without a model, so both sides are also
fed the same steps without one (arctic_driver.simulate: the target's greedy answer decides what is accepted), and
their drafts are compared step by step (printed under the table); our #MAT is still our engine's, one drafter through
the prompts in order (the global tree learns across them, as a vLLM server's does). Rows: vLLM's defaults (a chain),
use_tree_spec, and carry_over=false beside upstream's max_cached_requests=1.

PARD (AMD-AGI/PARD's pard_infer.py), DFlash (the dflash package's dflash_generate) and ReDrafter
(apple/ml-recurrent-drafter's RecurrentDrafting) rows are made by their own drivers, benchmarks/pard_driver.py,
dflash_parity.py and redrafter_vs_upstream.py (each a `comparisons(setup, tmp)` here and its upstream side, run in its
side environment as `python -m benchmarks.<driver> JOB OUT`); their docstrings say what each adapts. Their notes,
printed under the table: per-position acceptance on both sides, and for DFlash and ReDrafter the first drafts and the
steps compared one by one.

The upstream side runs in side virtual environments, made once in $SPECBENCH_CACHE/upstream-venv,
$SPECBENCH_CACHE/spec-bench-venv and $SPECBENCH_CACHE/arctic-venv (and the drivers' pard-venv, dflash-venv and
redrafter-upstream/venv; default ~/.cache/specbench/...) with --system-site-packages, so they reuse this machine's
torch; the packages are installed with --no-deps and only the dependencies the code paths need are added, pinned
(UPSTREAM_PINS, SPEC_BENCH_PINS, ARCTIC_PINS; the drivers' PARD_PINS, DFLASH_PINS, REDRAFTER_PINS). arctic-inference
is a source distribution: its suffix tree is compiled on install (C++20, cmake, ninja, nanobind; ARCTIC_BUILD), with
the build isolation off so that it builds against this machine's torch instead of downloading one. The drivers run
there as subprocesses. #MAT is a count, so machine load does not matter.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from omegaconf import OmegaConf

from bench.artifacts import PROJECT_ROOT, cache_dir
from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.models import dequantized_gguf, eos_token_ids, load_model
from benchmarks.arctic_driver import simulate
from benchmarks.upstream_driver import forwards_until_done, running_sums, spec_bench_order
from methods.eagle.checkpoints import load_eagle
from methods.eagle.static import Eagle1Drafter
from methods.lookahead import LookaheadDrafter
from methods.medusa.checkpoints import load_medusa
from methods.medusa.drafter import MedusaDrafter
from methods.recycling import TEMPLATES, RecyclingDrafter
from methods.samd import SamdDrafter
from methods.suffix_decoding import SuffixDecodingDrafter
from tasks import read_questions
from tasks.prompts import build_prompt

# lade 0.0.2 imports `_expand_mask` from transformers' Llama and patches its `greedy_search`: transformers <= 4.34.
# transformers 4.34.1 needs tokenizers < 0.15 and huggingface_hub < 1.0. The packages' other declared dependencies
# (fschat, gradio, accelerate==0.21, ...) are not used by the code run here.
UPSTREAM_PINS = ("lade==0.0.2", "medusa-llm==0.1", "eagle-llm==1.2.1", "transformers==4.34.1", "tokenizers==0.14.1",
                 "huggingface_hub==0.17.3")
# Spec-Bench's requirements.txt pins transformers 4.37.1 (its SAMD patches LlamaModel.forward of that version);
# tokenizers and huggingface_hub are the newest that version allows.
SPEC_BENCH_PINS = ("transformers==4.37.1", "tokenizers==0.15.2", "huggingface_hub==0.20.3")
SPEC_BENCH_GET = "git clone https://github.com/hemingkx/Spec-Bench {dir}"
SPEC_BENCH_METHODS = {"recycling", "samd"}
# arctic-inference's build needs nanobind (its pin) and wheel; this machine has its torch, cmake, ninja and g++. The
# package's other dependencies (vLLM, gRPC for its embedding server) are not used by its suffix tree.
ARCTIC_PINS = ("arctic-inference==0.3.0",)
ARCTIC_BUILD = ("nanobind==2.9.2", "wheel")
DRIVERS = {"packages": Path(__file__).with_name("upstream_driver.py"),
           "spec-bench": Path(__file__).with_name("spec_bench_driver.py"),
           "arctic": Path(__file__).with_name("arctic_driver.py")}
SIDES = {"packages": ("upstream-venv", UPSTREAM_PINS), "spec-bench": ("spec-bench-venv", SPEC_BENCH_PINS),
         "arctic": ("arctic-venv", ARCTIC_PINS, ARCTIC_BUILD)}
SPEC_BENCH_WARMUP = 3  # evaluation/eval.py: both turns of the first question, 3 times, before the counted ones
SAMD = {"n_predicts": 40, "len_threshold": 5, "len_bias": 5}  # Spec-Bench's eval.sh
SAMD_EAGLE2_TREE = {"total_token": 63, "depth": 5, "top_k": 8}  # model/samd's Eagle2Model defaults
MEDUSA_TREE = [1, 7, 6]  # medusa-llm 0.1's medusa_generate default
LOOKAHEAD = {"window_size": 15, "ngram_size": 5, "guess_set_size": 15}
UPSTREAM_LOOKAHEAD = {"initial_window": "upstream", "max_accept": "n_minus_1", "seed": 10}  # + slide
# vLLM's SpeculativeConfig defaults for method "suffix" (vLLM 0.32), as our conf/method/suffix.yaml sets them
SUFFIX = {"max_tree_depth": 24, "num_speculative_tokens": 24, "max_spec_factor": 1.0, "max_spec_offset": 0.0,
          "min_token_prob": 0.1, "use_tree_spec": False, "max_cached_requests": 10000}


def side_venv(name: str, pins: tuple[str, ...], build: tuple[str, ...] = ()) -> Path:
    """A side environment's python, made on first use (pins recorded in the venv; a change rebuilds it). With
    `build` (what building the pinned source distributions needs), those are installed first and the pins built
    against this machine's packages (no build isolation)."""
    venv = cache_dir() / name
    python, stamp = venv / "bin" / "python", venv / "specbench-pins.txt"
    if stamp.exists() and stamp.read_text() == "\n".join(build + pins):
        return python
    print(f"making the side environment {venv}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(venv)], check=True)
    isolation = []
    if build:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *build], check=True)
        isolation = ["--no-build-isolation"]
    env = {**os.environ, "CMAKE_ARGS": f"-DPython_EXECUTABLE={python}"}  # cmake would find the system's python
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *isolation, *pins], check=True,
                   env=env)
    side_torch = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], check=True,
                                capture_output=True, text=True).stdout.strip()
    if side_torch != torch.__version__:
        raise RuntimeError(f"the side environment's torch is {side_torch}, not this one's {torch.__version__}")
    stamp.write_text("\n".join(build + pins))
    return python


def spec_bench_checkout(folder: str | None) -> Path:
    """The Spec-Bench checkout; a missing one stops the run, saying how to get it."""
    path = Path(folder).expanduser() if folder else cache_dir() / "spec-bench"
    if not (path / "model" / "samd" / "samd_model.py").exists():
        raise SystemExit(f"no Spec-Bench checkout in {path}: {SPEC_BENCH_GET.format(dir=path)} (or --spec-bench DIR)")
    return path


def rope_theta(config) -> float:
    """The target's rotary base (transformers 5 keeps it in `rope_parameters`): upstream's heads read `rope_theta`
    from their own config.json and fall back to 10000, which is not SmolLM2's."""
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def side_model_dir(model_cfg) -> Path:
    """The dequantized model folder with a config.json that transformers 4.34 reads (rope_theta at top level), the
    weights a link to bench/models.py's copy."""
    source = dequantized_gguf(model_cfg)
    out = cache_dir() / "upstream" / source.name
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    rope = config.pop("rope_parameters", None) or {}
    config.update(rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)), rope_scaling=None,
                  torch_dtype="float32")
    config.setdefault("architectures", ["LlamaForCausalLM"])  # eagle-llm picks its model class from it
    config.pop("dtype", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = out / "model.safetensors"
    if not weights.exists():
        weights.symlink_to(source / "model.safetensors")
    return out


def slice_bias(vocab, vocab_size: int) -> torch.Tensor:
    """0 on the draft-vocabulary slice, -1e9 elsewhere: full-vocabulary logits that rank only the slice."""
    bias = torch.full((vocab_size,), -1e9)
    bias[vocab.token_ids.cpu()] = 0.0
    return bias


def convert_medusa(checkpoint: str, target, out: Path) -> Path:
    """Our Medusa heads in FasterDecoding's layout: `{head}.{layer}.linear.*` ResBlocks and `{head}.{layers}` the
    vocabulary projection, here the target's full LM head plus slice_bias (medusa's own projection has no bias)."""
    heads, vocab, _ = load_medusa(checkpoint, target)
    layers = len(heads.blocks[0])
    lm_head = target.get_output_embeddings().weight.detach().cpu()
    state = {f"{h}.{rest}": v.detach().cpu() for h in range(heads.num_heads)
             for rest, v in heads.blocks[h].state_dict().items()}
    for h in range(heads.num_heads):
        state[f"{h}.{layers}.weight"] = lm_head
        state[f"{h}.{layers}.bias"] = slice_bias(vocab, lm_head.shape[0])
    out.mkdir(parents=True)
    torch.save(state, out / "medusa_lm_head.pt")
    torch.save(vocab.token_ids.cpu(), out / "draft_vocab_ids.pt")
    (out / "config.json").write_text(json.dumps({"medusa_num_heads": heads.num_heads, "medusa_num_layers": layers}))
    return out


def convert_eagle(checkpoint: str, target, out: Path) -> Path:
    """Our EAGLE head in SafeAILab's layout (config.json + pytorch_model.bin: embed_tokens, fc, layers.0 without
    input_layernorm); the driver hands its draft the sliced LM head."""
    head, vocab, _ = load_eagle(checkpoint, target)
    state = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().cpu()}
    for key, value in head.state_dict().items():
        if key.startswith("fc."):
            state[key] = value.detach().cpu()
        elif key.startswith("body.layers.0."):
            state[key.removeprefix("body.")] = value.detach().cpu()
    c = target.config
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": True,
              "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
              "num_key_value_heads": c.num_key_value_heads, "hidden_act": c.hidden_act,
              "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
              "pad_token_id": c.pad_token_id, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
              "rope_theta": rope_theta(c), "rope_scaling": None, "tie_word_embeddings": False}
    out.mkdir(parents=True)
    torch.save(state, out / "pytorch_model.bin")
    torch.save(vocab.token_ids.cpu(), out / "draft_vocab_ids.pt")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def mt_bench_prompts(model, tokenizer, question_ids: list[int], max_new_tokens: int, eos) -> list[list[int]]:
    """Both turns' prompt ids of each question; turn 2 follows vanilla's (= every lossless method's) turn-1 answer."""
    vanilla = SpeculativeEngine(model)
    prompts = []
    for question in (q for q in read_questions() if q["question_id"] in question_ids):
        conversation = []
        for turn in question["turns"]:
            conversation.append({"role": "user", "content": turn})
            prompt = build_prompt(tokenizer, conversation)
            prompts.append(prompt)
            answer = vanilla.generate(prompt, StopCondition(max_new_tokens, frozenset(eos))).tokens
            conversation.append({"role": "assistant",
                                 "content": tokenizer.decode(answer, skip_special_tokens=True).strip()})
    return prompts


def smollm2_checkpoint(method: str) -> str:
    """The committed SmolLM2 checkpoint `method` runs with (conf/method_model/<method>/smollm2_135m.yaml)."""
    return compose_config(f"method={method}", "model=smollm2_135m").method.drafter.checkpoint


def comparisons(methods: set[str], model, heads_dir: Path) -> list[dict]:
    """Per row: method, settings, our drafter factory, and the upstream run (as the driver takes it)."""
    rows = []
    if "lookahead" in methods:
        for label, knobs, fwd_one in (("ours (defaults) vs lade default ALWAYS_FWD_ONE=1", {}, 1),
                                      ("upstream knobs, slide=one vs lade ALWAYS_FWD_ONE=1",
                                       {**UPSTREAM_LOOKAHEAD, "slide": "one"}, 1),
                                      ("upstream knobs, slide=accepted vs lade ALWAYS_FWD_ONE=0",
                                       {**UPSTREAM_LOOKAHEAD, "slide": "accepted"}, 0)):
            rows.append({"method": "lookahead", "settings": f"W15 N5 G15, {label}",
                         "ours": lambda knobs=knobs: LookaheadDrafter(**LOOKAHEAD, **knobs),
                         "upstream": {"method": "lookahead", **LOOKAHEAD, "always_fwd_one": fwd_one}})
    if "medusa" in methods:
        choices = [[i] for i in range(MEDUSA_TREE[1])] + [[i, j] for i in range(MEDUSA_TREE[1])
                                                           for j in range(MEDUSA_TREE[2])]
        medusa_heads = smollm2_checkpoint("medusa")
        folder = convert_medusa(medusa_heads, model, heads_dir / "medusa")
        rows.append({"method": "medusa", "settings": f"medusa_choices={MEDUSA_TREE} ({len(choices)} nodes)",
                     "ours": lambda: MedusaDrafter(model, checkpoint=medusa_heads, choices=choices),
                     "upstream": {"method": "medusa", "heads_dir": str(folder), "medusa_choices": MEDUSA_TREE}})
    if "eagle" in methods:
        from methods.heads.trees import TREES

        eagle_head = smollm2_checkpoint("eagle")
        folder = convert_eagle(eagle_head, model, heads_dir / "eagle")
        rows.append({"method": "eagle", "settings": "static tree mc_sim_7b_63 (= eagle_7b_25, 25 nodes)",
                     "ours": lambda: Eagle1Drafter(model, checkpoint=eagle_head, choices="eagle_7b_25"),
                     "upstream": {"method": "eagle", "head_dir": str(folder), "tree_choices": TREES["eagle_7b_25"]}})
    return rows


def recycle_tree_choices(tree_adj: dict[str, list[int]]) -> list[list[int]]:
    """SAM-Decoding's Token Recycling tree (model/samd/config/token_recycle.json: node -> its children in rank order,
    node 0 the root) as our template's choices, breadth-first (so level by level)."""
    choices, queue = [], [(0, [])]
    for node, path in queue:  # the queue grows while it is read
        for rank, child in enumerate(tree_adj[str(node)]):
            queue.append((child, path + [rank]))
            choices.append(path + [rank])
    return choices


def knob_text(knobs: dict, prefix: str = "") -> str:
    """`knobs` as the overrides that set them; a list (a tree's choices) by its size."""
    def value(v):
        return f"<{len(v)} choices>" if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else v
    return " ".join(f"{prefix}{name}={value(v)}" for name, v in knobs.items())


def samd_recycling_knobs(spec_bench: Path) -> tuple[dict, str]:
    """Our recycling fallback's knobs for upstream's (its 60-node tree, never reset, seeded from the prefill's rows),
    and what this branch cannot set yet."""
    tree_adj = json.loads((spec_bench / "model" / "samd" / "config" / "token_recycle.json").read_text())["tree_adj"]
    upstream_tree = recycle_tree_choices(tree_adj)
    knobs = {"k": 8, "template": "samd" if "samd" in TEMPLATES else upstream_tree, "carry_over": True}
    missing = " (TEMPLATES['samd'] is not token_recycle.json's tree)" if TEMPLATES.get("samd", upstream_tree) != \
        upstream_tree else ""
    if "seed_from_prefill" in inspect.signature(RecyclingDrafter).parameters:
        return {**knobs, "seed_from_prefill": True}, missing
    return knobs, missing + " (no seed_from_prefill knob in this branch: rows not seeded from the prefill)"


def spec_bench_comparisons(methods: set[str], model, tokenizer, heads_dir: Path, spec_bench: Path | None) -> list[dict]:
    """Rows against Spec-Bench's runners: one drafter object through Spec-Bench's sequence (its warm-up first)."""
    rows = []
    common = {"side": "spec-bench", "warmup": SPEC_BENCH_WARMUP}
    if "recycling" in methods:
        upstream = {"method": "recycling", "output_id_topk": 8, "tree_version": "2.2.2"}
        for carry_over in (True, False):
            knobs = {"k": 8, "template": "2.2.2", "carry_over": carry_over}
            rows.append({**common, "method": "recycling", "upstream": upstream, "settings": f"{knob_text(knobs)} vs "
                         "Spec-Bench inference_recycling --output-id-topk 8 --tree_version 2.2.2",
                         "ours": lambda knobs=knobs: RecyclingDrafter(model, **knobs)})
    if "samd" in methods:
        recycling, missing = samd_recycling_knobs(spec_bench)
        rows.append({**common, "method": "samd[recycling]", "decode_past": 1,
                     "settings": f"{knob_text(SAMD)} fallback=recycling {knob_text(recycling, 'recycling.')}{missing}, "
                                 "1 token decoded past max_new_tokens as upstream's generate, vs Spec-Bench "
                                 "inference_samd --tree_method token_recycle",
                     "ours": lambda: SamdDrafter(model, tokenizer, **SAMD, fallback="recycling", recycling=recycling),
                     "upstream": {"method": "samd", **SAMD, "tree_method": "token_recycle"}})
        head = compose_config("method=samd", "model=smollm2_135m").method.drafter.eagle2.checkpoint
        folder = convert_eagle(head, model, heads_dir / "samd-eagle")
        rows.append({**common, "method": "samd[eagle2]",
                     "settings": f"{knob_text(SAMD)} fallback=eagle2 {knob_text(SAMD_EAGLE2_TREE, 'eagle2.')} vs "
                                 "Spec-Bench inference_samd --tree_method eagle2 (its tree: 63/5/8)",
                     "ours": lambda: SamdDrafter(model, tokenizer, **SAMD, fallback="eagle2",
                                                 eagle2={"checkpoint": head, **SAMD_EAGLE2_TREE}),
                     "upstream": {"method": "samd", **SAMD, "tree_method": "eagle2", "head_dir": str(folder)}})
    for row in rows:
        row["upstream"]["warmup"] = SPEC_BENCH_WARMUP
    return rows


def suffix_comparisons(methods: set[str], model) -> list[dict]:
    """Rows against arctic-inference's suffix tree: one drafter (one cache upstream) through the prompts in order."""
    if "suffix" not in methods:
        return []
    rows = []
    for label, ours, theirs in (("vLLM's defaults, a chain", {}, {}),
                                ("use_tree_spec=true", {"use_tree_spec": True}, {"use_tree_spec": True}),
                                ("carry_over=false vs max_cached_requests=1", {"carry_over": False},
                                 {"max_cached_requests": 1})):
        knobs = {**SUFFIX, **ours}
        rows.append({"method": "suffix", "side": "arctic", "warmup": 0, "knobs": knobs,
                     "settings": f"{label}: ours {knob_text(ours) or 'at SUFFIX'} vs arctic-inference 0.3.0 "
                                 f"SuffixDecodingCache {knob_text(theirs) or 'at SUFFIX'}",
                     "ours": lambda knobs=knobs: SuffixDecodingDrafter(model, **knobs),
                     "upstream": {"method": "suffix", "knobs": {**SUFFIX, **theirs}}})
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


def our_outputs(model, row: dict, prompts: list[list[int]], stop: StopCondition) -> list[tuple[list[int], int]]:
    """Our (tokens, target forwards until they were known) per prompt: a fresh drafter per prompt, or (rows with a
    warm-up) one drafter through Spec-Bench's sequence, the warm-up left out. Rows with `decode_past` decode that
    many tokens past max_new_tokens, as upstream's loop does (what the drafter learns from them carries over)."""
    if "warmup" not in row:
        outputs = [SpeculativeEngine(model, row["ours"]()).generate(p, stop) for p in prompts]
    else:
        engine = SpeculativeEngine(model, row["ours"]())
        longer = dataclasses.replace(stop, max_new_tokens=stop.max_new_tokens + row.get("decode_past", 0))
        outputs = [out for counted, out in ((counted, engine.generate(p, longer))
                                            for counted, p in spec_bench_order(prompts, row["warmup"])) if counted]
    return [counted_output(out, stop.max_new_tokens) for out in outputs]


def engine_outputs(setup, make_drafter) -> list:
    """Our engine's TurnOutput of each of `setup`'s prompts, a fresh drafter (make_drafter()) for each."""
    return [SpeculativeEngine(setup.model, make_drafter()).generate(p, setup.stop) for p in setup.prompts]


def counted_output(out, max_new_tokens: int) -> tuple[list[int], int]:
    """(tokens up to max_new_tokens, target forwards until they were known: the prefill, then the decode steps) of
    one of our engine's TurnOutputs."""
    tokens = out.tokens[:max_new_tokens]
    return tokens, forwards_until_done(running_sums(decode_step_lengths(out), start=1), tokens)


def decode_step_lengths(out) -> list[int]:
    """Tokens each decode step added: TurnOutput.accept_lengths, less the prefill's entry where it books one (the
    prefill's token counted as a step, before issue 42's Spec-Bench counting)."""
    lengths = out.accept_lengths
    return lengths[1:] if sum(lengths) == len(out.tokens) else lengths


def side_outputs(python: Path, driver: list[str], job: dict, tmp: Path, name: str):
    """What a driver (`driver`: a script's path, or -m and a module) writes when run on `job` in a side environment
    (`python`), from the project's folder: `python *driver JOB.json OUT.json`."""
    (tmp / f"{name}.json").write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    subprocess.run([str(python), *driver, str(tmp / f"{name}.json"), str(tmp / f"{name}-out.json")], check=True,
                   env=env, cwd=PROJECT_ROOT)
    return json.loads((tmp / f"{name}-out.json").read_text())


def run_upstream(side: str, rows: list[dict], job: dict, tmp: Path, spec_bench: Path | None) -> dict:
    """The upstream runs of `rows` (one side) in their side venv: {run name: per prompt {"tokens", "steps"}}."""
    job = {**job, "runs": list({row["upstream"]["name"]: row["upstream"] for row in rows}.values())}
    checkout = [str(spec_bench)] if side == "spec-bench" else []
    return side_outputs(side_venv(*SIDES[side]), [str(DRIVERS[side]), *checkout], job, tmp, side)


def divergence(ours: list[list[int]], theirs: list[list[int]]) -> str:
    for turn, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return f"no (prompt {turn}, token {index})"
    return "yes"


def generate_recording(engine, drafter, prompt: list[int], stop, search: str, keep=lambda length: True):
    """(engine.generate's output, {new tokens known: the sequences drafted there}): what the drafter's `search`
    method (called as search(root, length), returning a tensor of token sequences) gave where `keep(length)`."""
    drafted, known, inner = {}, {"now": 0}, getattr(drafter, search)

    def propose(context: list[int], max_tokens: int):
        known["now"] = len(context) - len(prompt)
        return type(drafter).propose(drafter, context, max_tokens)

    def recording(root: int, length: int):
        sequences = inner(root, length)
        if keep(length):
            drafted[known["now"]] = sequences.tolist()
        return sequences

    drafter.propose = propose
    setattr(drafter, search, recording)
    try:
        out = engine.generate(prompt, stop)
    finally:
        del drafter.propose
        delattr(drafter, search)
    return out, drafted


def acceptance_shares(step_lengths: list[list[int]], positions: int) -> str:
    """Per draft position i (1..positions): the share of steps (tokens each step added, the bonus token included)
    that accepted at least i drafts, as "a / b / ..."."""
    steps = [n - 1 for lengths in step_lengths for n in lengths]
    return " / ".join(f"{sum(n >= i for n in steps) / max(len(steps), 1):.3f}" for i in range(1, positions + 1))


def acceptance_note(label: str, ours: list, their_steps: list[list[int]], positions: int, upstream: str) -> str:
    """`label`: acceptance_shares of our TurnOutputs beside upstream's (its tokens per step, per prompt)."""
    return (f"{label}: steps accepting >= {' / '.join(map(str, range(1, positions + 1)))} drafts: ours "
            f"{acceptance_shares([decode_step_lengths(o) for o in ours], positions)}, {upstream} "
            f"{acceptance_shares(their_steps, positions)}")


@dataclasses.dataclass
class Setup:
    """What every row decodes: the float32 target, its tokenizer and model config, the prompts, where to stop."""
    model: object
    tokenizer: object
    model_cfg: object
    prompts: list[list[int]]
    stop: StopCondition


@dataclasses.dataclass
class Comparison:
    """One row of the table: per prompt, each side's (new tokens, target forwards until they were known); notes are
    printed under the table."""
    method: str
    settings: str
    ours: list[tuple[list[int], int]]
    theirs: list[tuple[list[int], int]]
    notes: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        ours, theirs = (sum(len(t) for t, _ in side) / sum(f for _, f in side) for side in (self.ours, self.theirs))
        equal = divergence([t for t, _ in self.ours], [t for t, _ in self.theirs])
        return (f"| {self.method} | {self.settings} | {ours:.3f} | {theirs:.3f} | {(ours - theirs) / theirs:+.1%} | "
                f"{equal} |")


# methods whose rows a driver of their own makes: its comparisons(setup, tmp) -> list[Comparison] (imported when
# asked for: each imports this module)
DRIVER_METHODS = {"pard": "benchmarks.pard_driver", "dflash": "benchmarks.dflash_parity",
                  "redrafter": "benchmarks.redrafter_vs_upstream"}


def required_checkout(path: Path, marker: str, get: str) -> Path:
    """`path`, a checkout of upstream code that has `marker`; a missing one stops the run, saying how to get it."""
    if not (path / marker).exists():
        raise SystemExit(f"no {marker} in {path}: {get.format(dir=path)}")
    return path


def parity_setup(questions: str, max_new_tokens: int) -> Setup:
    """SmolLM2-135M in float32 and MT-bench `questions`' prompts, both turns."""
    cfg = OmegaConf.load(PROJECT_ROOT / "conf" / "model" / "smollm2_135m.yaml")
    cfg.dtype = "float32"
    model, tokenizer = load_model(cfg, torch.device("cpu"))
    eos = sorted(eos_token_ids(model, tokenizer))
    prompts = mt_bench_prompts(model, tokenizer, [int(q) for q in questions.split(",")], max_new_tokens, eos)
    return Setup(model, tokenizer, cfg, prompts, StopCondition(max_new_tokens, frozenset(eos)))


def package_comparisons(methods: set[str], setup: Setup, tmp: Path, spec_bench: Path | None) -> list[Comparison]:
    """The rows whose upstream side benchmarks/upstream_driver.py, spec_bench_driver.py or arctic_driver.py runs."""
    model, prompts, stop = setup.model, setup.prompts, setup.stop
    eos = sorted(stop.eos_token_ids)
    job = {"model_dir": str(side_model_dir(setup.model_cfg)), "eos": eos[0], "max_new_tokens": stop.max_new_tokens,
           "prompts": prompts}
    if "suffix" in methods:  # the target's greedy answers: what a model-free drafter is accepted against
        job["answers"] = [SpeculativeEngine(model).generate(p, stop).tokens for p in prompts]
    rows = comparisons(methods, model, tmp) + spec_bench_comparisons(methods, model, setup.tokenizer, tmp, spec_bench)
    rows += suffix_comparisons(methods, model)
    for index, row in enumerate(rows):
        row["upstream"]["name"] = f"run{index}"  # rows sharing an upstream run share its last name
    upstream = {}
    for side in sorted({row.get("side", "packages") for row in rows}):
        upstream.update(run_upstream(side, [r for r in rows if r.get("side", "packages") == side], job, tmp,
                                     spec_bench))
    out = []
    for row in rows:
        theirs = upstream[row["upstream"]["name"]]
        notes = []
        if row["method"] == "suffix":
            drafts = simulated_drafts(row["ours"], prompts, job["answers"], stop.max_new_tokens)
            notes.append(f"suffix, {row['settings'].split(':')[0]}: drafts equal at "
                         f"{draft_agreement(drafts, [r['drafts'] for r in theirs])}")
        out.append(Comparison(row["method"], row["settings"], our_outputs(model, row, prompts, stop),
                              [(r["tokens"], r["steps"]) for r in theirs], notes))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="lookahead,medusa,eagle,recycling,samd,suffix,pard,dflash,redrafter")
    parser.add_argument("--questions", default="81,82", help="question ids (MT-bench: 81-160)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--spec-bench", default=None, help="a hemingkx/Spec-Bench checkout (default: "
                        "$SPECBENCH_CACHE/spec-bench)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    methods = set(args.methods.split(","))
    spec_bench = spec_bench_checkout(args.spec_bench) if methods & SPEC_BENCH_METHODS else None
    setup = parity_setup(args.questions, args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        rows = package_comparisons(methods, setup, Path(tmp), spec_bench)
        for method in (m for m in DRIVER_METHODS if m in methods):
            rows += importlib.import_module(DRIVER_METHODS[method]).comparisons(setup, Path(tmp))
    print(f"{len(setup.prompts)} prompts (MT-bench {args.questions}, both turns), {args.max_new_tokens} new tokens, "
          "greedy, float32, SmolLM2-135M")
    print("| method | settings | our #MAT | upstream #MAT | difference | tokens equal |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row.line())
    for note in (note for row in rows for note in row.notes):
        print(note)


if __name__ == "__main__":
    main()
