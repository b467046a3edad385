"""MLPSpeculator beside two reference implementations (sides/mlp_speculator_driver.py), on our stages converted to
IBM's layout (methods/mlp_speculator/checkpoints.py, here in float32) with the same target and prompt ids: vLLM 0.32's
own `MLPSpeculator` module drafting a chain (in the vLLM CPU build's environment, tools/build_vllm_cpu.sh) beside ours
at the same chain (top-1 per stage, one candidate), and IBM's fms-extras `generate_suffixes` with its candidate
selection (a checkout in $SPECBENCH_CACHE/upstream/fms-extras, run in $SPECBENCH_CACHE/fms-venv: ibm-fms 0.0.5, what
the checkout imports) beside ours at the checkpoint's candidates (conf/method/mlp_speculator.yaml: upstream's
defaults). Per side, the notes give ours on the converted folder (our loader reads IBM's layout) and upstream
against ours (#MAT, steps accepting at least 1..n drafts, tokens, drafts where both drafted as deep), and how far the
target's last hidden state there is from ours."""
from __future__ import annotations

from pathlib import Path

import torch

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine
from bench.parity.environments import Checkout, SideEnvironment, run_driver
from bench.parity.protocol import (
    Comparison,
    Setup,
    acceptance_shares,
    counted_steps,
    decode_step_lengths,
    generate_recording,
    tokens_equal,
)
from methods.mlp_speculator.checkpoints import write_ibm_layout

AGAINST = "vLLM 0.32's MLPSpeculator module, fms-extras"
FMS = SideEnvironment("fms-venv", ("ibm-fms==0.0.5",))
FMS_EXTRAS = Checkout("fms-extras", "upstream/fms-extras", "fms_extras/models/speculator.py",
                      "git clone https://github.com/foundation-model-stack/fms-extras {dir}")
SIDES = {"vllm": "vLLM 0.32 MLPSpeculator module, converted folder",
         "fms-extras": "fms-extras MLPSpeculator, converted folder"}
CANDIDATE_KNOBS = ("n_predict", "top_k_tokens_per_head", "n_candidates")


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    upstream = {key: setup.knobs("mlp_speculator", upstream=True)[key] for key in CANDIDATE_KNOBS}
    stages = setup.drafter("mlp_speculator", **upstream)()
    folder = work / "ibm-float32"
    write_ibm_layout(stages.stages, stages.vocab, folder, dtype=torch.float32)
    chain = {"n_predict": stages.n_predict, "top_k_tokens_per_head": [1] * stages.n_predict, "n_candidates": 1}
    return [side_by_side(setup, side, knobs, folder, work / side)
            for side, knobs in (("vllm", chain), ("fms-extras", upstream))]


def side_by_side(setup: Setup, side: str, knobs: dict, folder: Path, work: Path) -> Comparison:
    """Ours with `knobs` on our checkpoint and on the converted folder, then `side` in its environment."""
    ours = setup.drafter("mlp_speculator", **knobs)()
    converted = setup.drafter("mlp_speculator", **knobs, checkpoint=str(folder))()
    runs = {name: [our_decode(SpeculativeEngine(setup.model, drafter), drafter, p, setup.stop) for p in setup.prompts]
            for name, drafter in (("ours", ours), ("ours, converted folder", converted))}
    job = {**setup.side_job(), "eos": sorted(setup.stop.eos_token_ids), "side": side, "speculator_dir": str(folder),
           "n_predict": ours.n_predict, "top_k_tokens_per_head": ours.top_k, "n_candidates": ours.n_candidates}
    job["target_dir"] = job["model_dir"]
    if side == "fms-extras":
        job["fms_extras"] = str(FMS_EXTRAS.path(setup.checkouts))
    theirs = run_driver(side_python(side), "mlp_speculator_driver", job, work)
    with torch.inference_mode():
        mine = setup.model(input_ids=torch.tensor([setup.prompts[0]]),
                           output_hidden_states=True).hidden_states[-1][0, -1]
    gap = float((torch.tensor(theirs["first_hidden"]) - mine).abs().max())
    runs[SIDES[side]] = [{**r, "drafts": {int(k): v for k, v in r["drafts"].items()}} for r in theirs["runs"]]
    notes = [run_summary(f"mlp_speculator, {name}", side_runs, runs["ours"], ours.n_predict)
             for name, side_runs in list(runs.items())[1:]]
    notes.append(f"mlp_speculator, {side}: the target's last hidden state of the first prompt there vs ours: max "
                 f"|difference| {gap:.2e}")
    return Comparison("mlp_speculator", f"top_k_tokens_per_head {ours.top_k}, n_candidates {ours.n_candidates} vs "
                      f"{SIDES[side]}", counted_steps(runs["ours"]), counted_steps(runs[SIDES[side]]), notes)


def side_python(side: str) -> Path:
    """vLLM's CPU build's python (conf/server/shared/vllm_cpu.yaml), or the fms environment's."""
    if side == "fms-extras":
        return FMS.python()
    server = compose_config("backend=server", "server=vllm_cpu_ngram").server
    python = Path(server.binary).expanduser()
    if not python.exists():
        raise SystemExit(f"no {python}: {server.build_hint}")
    return python


def our_decode(engine, drafter, prompt: list[int], stop) -> dict:
    """Our engine's record of `prompt` in the driver's shape: tokens, tokens per decode step, the candidate sequences
    drafted at each point."""
    out, drafted = generate_recording(engine, drafter, prompt, stop, "candidates")
    return {"tokens": out.tokens, "steps": decode_step_lengths(out), "drafts": drafted}


def same_drafts(runs: list[dict], reference: list[dict]) -> tuple[int, int]:
    """(equal, compared): the points (prompt, new tokens known) where both sides drafted sequences of the same
    length, and how many of them drafted the same sequences in the same order."""
    points = [(mine[p], theirs[p]) for mine, theirs in ((r["drafts"], ref["drafts"]) for r, ref in zip(runs, reference))
              for p in mine.keys() & theirs.keys() if len(mine[p][0]) == len(theirs[p][0])]
    return sum(a == b for a, b in points), len(points)


def run_summary(name: str, runs: list[dict], reference: list[dict], n_predict: int) -> str:
    """`runs` against `reference`: #MAT, per-position acceptance, tokens and drafts."""
    row = Comparison(name, "", counted_steps(runs), counted_steps(reference)).record()
    return (f"{name}: #MAT {row['our_mat']:.3f}, steps accepting >= {' / '.join(map(str, range(1, n_predict + 1)))} "
            f"drafts {acceptance_shares([r['steps'] for r in runs], n_predict)}, tokens equal to ours "
            f"{tokens_equal(row)}, drafts equal to ours (where both drafted as deep) "
            "{}/{}".format(*same_drafts(runs, reference)))
