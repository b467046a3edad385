"""One benchmark run: decode every question of a task with a method and, interleaved, with vanilla."""
from __future__ import annotations

import inspect
import json
import math
import platform
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import hydra.utils
import pandas as pd
import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from bench.contention import available_cores, is_starved, machine_load, start_warnings, verdict
from bench import method_label
from bench.batched import BATCH_PROBE_SHARE, BatchedEngine
from bench.budget import AutoBudget, SpeculationPlanner
from bench.costmodel import device_name
from bench.decoding import BatchQuestionDecoder, PromptTooLong, QuestionDecoder, decode_group
from bench.engine import SpeculativeEngine, StopCondition
from bench.gpu import GpuMonitor
from bench.metrics import speedup_text, summarize
from bench.models import PROJECT_ROOT, context_window, eos_token_ids, load_model, resolve_device
from bench.profile import profile_for_run
from bench.records import AnswerFile, answer_record, config_key
from bench.sampling import SamplingConfig
from bench.validate import validate
from tasks import build_prompt, load_questions

SUMMARY_COLUMNS = ["task", "n_questions", "tokens_per_s", "baseline_tokens_per_s", "speedup", "predicted_speedup",
                   "mean_accepted_tokens", "mean_verified_tokens", "draft_share", "verify_share", "exact_match",
                   "cpu_share"]  # printed at the end of a run; speedup with its interval


def compose_config(*overrides: str, return_hydra_config: bool = False) -> DictConfig:
    """conf/config.yaml with Hydra `overrides`, as `python -m bench ...` composes it, without running anything."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)


def build_drafter(method_cfg: DictConfig, model, tokenizer, sampling: SamplingConfig):
    """The method's drafter from `method.drafter` (`_target_` plus knobs); None for vanilla."""
    if method_cfg.get("drafter") is None:
        return None
    knobs = OmegaConf.to_container(method_cfg.drafter, resolve=True)
    cls = hydra.utils.get_class(knobs.pop("_target_"))
    parameters = inspect.signature(cls).parameters
    if "sampling" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        knobs["sampling"] = sampling
    return cls(target=model, tokenizer=tokenizer, **knobs)


@torch.inference_mode()
def find_divergence(model, turns: list[dict], baseline: dict, tie_margin: float) -> dict | None:
    """First position where greedy tokens differ from vanilla's, and whether the target's top-2 logits there are
    within `tie_margin` (a numerical tie that batched vs. single-token arithmetic may break either way)."""
    for index, (turn, base_ids) in enumerate(zip(turns, baseline["choices"][0]["token_ids"])):
        ids = turn["token_ids"]
        if ids == base_ids:
            continue
        position = next((i for i, (a, b) in enumerate(zip(ids, base_ids)) if a != b), min(len(ids), len(base_ids)))
        if position >= min(len(ids), len(base_ids)):  # one stopped earlier: stop rules differ, never a tie
            return {"turn": index, "position": position, "logit_gap": math.inf, "numeric_tie": False}
        prefix = torch.tensor([turn["prompt_ids"] + base_ids[:position]], device=model.device)
        logits = model(input_ids=prefix, logits_to_keep=1).logits[0, -1].float()
        ours, theirs = ids[position], base_ids[position]
        gap = (logits[theirs] - logits[ours]).item()
        top2 = logits.topk(2).indices.tolist()
        return {"turn": index, "position": position, "vanilla_token": theirs, "method_token": ours,
                "logit_gap": gap, "numeric_tie": ours in top2 and theirs in top2 and abs(gap) <= tie_margin}
    return None


def run_metadata(cfg: DictConfig, device: torch.device, started: float, gpu: GpuMonitor) -> dict:
    """What a reader needs to trust or reproduce the numbers: config, code version, software, hardware."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=PROJECT_ROOT, capture_output=True,
                                    text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "git_commit": commit,
        "git_dirty": dirty,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": device_name(device),
        "cpu_threads": torch.get_num_threads(),
        "dtype": cfg.model.dtype,
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **gpu.report(),
    }


def run(cfg: DictConfig) -> pd.DataFrame:
    """Run `cfg.method` on `cfg.task`; writes answers.jsonl, baseline.jsonl, summary.csv, meta.json to out_dir, and
    skipped.jsonl for questions too long for the model's context window. Returns the summary (None: no answers)."""
    started = time.time()
    validate(cfg)
    device = resolve_device(cfg.device)
    warned = start_warnings(torch.get_num_threads(), available_cores(), machine_load(), device.type == "cuda")
    for warning in warned:
        print(f"WARNING: {warning}", file=sys.stderr)
    out_dir = Path(cfg.out_dir)
    questions = load_questions(cfg.task)  # before the model: a bad task file is refused at once
    model, tokenizer = load_model(cfg.model, device)
    sampling = SamplingConfig(cfg.gen.temperature, cfg.gen.top_k, cfg.gen.top_p)
    stop = StopCondition(cfg.gen.max_new_tokens, frozenset(eos_token_ids(model, tokenizer)),
                         tuple(cfg.gen.stop_strings), tokenizer)
    batch = int(cfg.gen.get("batch_size", 1))
    rows_per_batch = clamped_batch(batch, len(questions), cfg.task.name)
    batch_policy = cfg.method.get("batch_policy", "always")
    planned = cfg.method.get("budget", "upstream") == "auto" or batch_policy == "adaptive"
    method = method_label(cfg.method.name, cfg.method.get("budget"), batch_policy)
    is_vanilla = cfg.method.get("drafter") is None
    context = context_window(model)
    plain = SpeculativeEngine(model, None, sampling)  # first: refuses a model it cannot serve before any drafter setup
    profile = profile_for_run(cfg, model, device, make=planned)
    drafter = build_drafter(cfg.method, model, tokenizer, sampling)
    gpu = GpuMonitor(device)
    energy = gpu.energy_joules if gpu.energy_source else None  # joules per turn, where NVML can tell
    if batch == 1:
        if planned:
            drafter = AutoBudget(drafter, profile, device)
        decode = QuestionDecoder(SpeculativeEngine(model, drafter, sampling), tokenizer, stop, device, context,
                                 cfg.repeats, energy)
        vanilla = decode if is_vanilla else QuestionDecoder(plain, tokenizer, stop, device, context, cfg.repeats,
                                                            energy)
    else:
        planner = SpeculationPlanner(profile, probe_share=BATCH_PROBE_SHARE) if planned else None
        decode = BatchQuestionDecoder(BatchedEngine(model, drafter, sampling, planner), tokenizer, stop, device,
                                      context, cfg.repeats, energy)
        vanilla = decode if is_vanilla else BatchQuestionDecoder(BatchedEngine(model, None, sampling), tokenizer,
                                                                 stop, device, context, cfg.repeats, energy)

    gen = OmegaConf.to_container(cfg.gen, resolve=True)
    if gen.get("batch_size") == 1:
        del gen["batch_size"]  # batch-1 runs keep the keys they had before batching existed
    setting = {"model": OmegaConf.to_container(cfg.model, resolve=True), "device": str(device), "gen": gen,
               "seed": cfg.seed,
               "source": OmegaConf.to_container(cfg.task.source, resolve=True)}
    baseline_key = config_key(**setting)
    method_setting = OmegaConf.to_container(cfg.method)
    if method_setting.get("batch_policy") == "always":
        del method_setting["batch_policy"]  # as batch-1 runs were keyed before batching existed
    method_key = config_key(**setting, method=method_setting,
                            artifact=getattr(decode.engine.drafter, "artifact", None))  # drafts' weights or datastore
    answers = AnswerFile(out_dir / "answers.jsonl", method_key, strict=True)
    baselines = answers if is_vanilla else AnswerFile(out_dir / "baseline.jsonl", baseline_key, strict=False)
    skipped = AnswerFile(out_dir / "skipped.jsonl", method_key, strict=False)  # prompts too long for the model
    with_baseline = cfg.baseline and not is_vanilla
    todo = [q for q in questions if q["question_id"] not in answers and q["question_id"] not in skipped]

    warm_prompts = (build_prompt(tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in todo)
    warm_prompt = next((p for p in warm_prompts if context is None or len(p) + cfg.warmup_tokens <= context), None)
    if warm_prompt is not None and cfg.warmup_tokens:  # untimed, so first-call costs miss the first question
        warm_stop = StopCondition(cfg.warmup_tokens, stop.eos_token_ids)
        warm_rows = min(rows_per_batch, len(todo))  # never more rows than the first real batch
        for decoder in {id(d): d for d in (decode, vanilla)}.values():
            if batch == 1:
                decoder.engine.generate(warm_prompt, warm_stop, seed=cfg.seed)
            else:
                decoder.engine.generate([warm_prompt] * warm_rows, warm_stop, [cfg.seed] * warm_rows)

    def store_answer(question: dict, turns, base_turns) -> None:
        """Append a question's record (and its vanilla baseline's), or note it skipped when a prompt did not fit."""
        if isinstance(turns, PromptTooLong) or isinstance(base_turns, PromptTooLong):
            err = turns if isinstance(turns, PromptTooLong) else base_turns
            skipped.append({"question_id": question["question_id"], "category": question["category"],
                            "run_key": skipped.run_key, "skipped": str(err)})
            tqdm.write(f"skipped question {question['question_id']}: {err}")
            return
        if base_turns is not None and question["question_id"] not in baselines:
            baselines.append(answer_record(question, cfg.model.name, "vanilla", baseline_key, base_turns))
        record = answer_record(question, cfg.model.name, method, answers.run_key, turns)
        if not sampling.greedy:
            record["exact_match"], record["divergence"] = None, None
        elif is_vanilla:
            record["exact_match"], record["divergence"] = True, None
        elif question["question_id"] in baselines:
            base = baselines.records[question["question_id"]]
            record["exact_match"] = [t["token_ids"] for t in turns] == base["choices"][0]["token_ids"]
            record["divergence"] = find_divergence(model, turns, base, cfg.model.tie_margin)
        answers.append(record)
        gpu.sample()

    try:
        bar = tqdm(total=len(todo), desc=f"{method} on {cfg.task.name}", unit="q", dynamic_ncols=True)
        for number, start in enumerate(range(0, len(todo), batch)):
            group = todo[start : start + batch]
            seeds = [cfg.seed + q["question_id"] for q in group]
            base_results = None
            need_base = with_baseline and any(q["question_id"] not in baselines for q in group)
            if need_base and number % 2 == 0:  # alternate the order so neither side always runs second
                base_results = decode_group(vanilla, group, seeds)
            results = decode_group(decode, group, seeds)
            if need_base and base_results is None:
                base_results = decode_group(vanilla, group, seeds)
            for index, (question, turns) in enumerate(zip(group, results)):
                base_turns = None if base_results is None else base_results[index]
                store_answer(question, turns, base_turns)
            bar.update(len(group))
            if answers.records:
                bar.set_postfix_str(_progress_note(method, answers, baselines))
    finally:  # also after an interruption: summarise what is done
        out_dir.mkdir(parents=True, exist_ok=True)
        summary = summarize(method, list(answers.records.values()), baselines.records,
                            starvation_threshold=cfg.starvation_threshold, ci_samples=cfg.bootstrap.samples,
                            ci_seed=cfg.bootstrap.seed, profile=profile if batch == 1 else None
                            ) if answers.records else None
        if summary is not None:
            summary.insert(2, "batch_size", batch)
            summary.to_csv(out_dir / "summary.csv", index=False)
        meta = {**run_metadata(cfg, device, started, gpu), "run_key": answers.run_key, "baseline_run_key": baseline_key,
                "skipped_questions": sorted(skipped.records), "start_warnings": warned,
                "profile": None if profile is None else profile.__dict__,
                **starvation_facts(summary, cfg.starvation_threshold)}
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"\n{method} on {cfg.task.name} ({cfg.model.name}, {cfg.model.dtype}, {device}) -> {out_dir}")
    if skipped.records:
        print(f"skipped {len(skipped.records)} question(s) whose prompt + gen.max_new_tokens exceed the model's context "
              f"window: {skipped.path}")
    if summary is not None:
        print(closing_table(summary).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(verdict(summary.cpu_share.iloc[-1], cfg.starvation_threshold))
    return summary


def clamped_batch(batch: int, questions: int, task: str) -> int:
    """Rows per batch: gen.batch_size, or the task's question count when that is smaller (said once on stderr)."""
    if batch <= questions:
        return batch
    print(f"note: gen.batch_size={batch} > the {questions} question(s) of task '{task}': decoding them "
          f"{questions} at a time", file=sys.stderr)
    return questions


def closing_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The table printed at the end of a run: SUMMARY_COLUMNS, the speedup as `1.35x (1.21-1.49)`."""
    energy = ["joules_per_token", "baseline_joules_per_token"] if summary.joules_per_token.notna().any() else []
    shown = summary[SUMMARY_COLUMNS + energy].copy()
    shown["speedup"] = [speedup_text(*values) for values in
                        zip(summary.speedup, summary.speedup_ci_low, summary.speedup_ci_high)]
    return shown.rename(columns={"speedup": "speedup (95% CI)"})


def starvation_facts(summary: pd.DataFrame | None, threshold: float) -> dict:
    """meta.json's starvation keys from the overall row: cpu_share and starved (null where they do not apply)."""
    share = math.nan if summary is None else float(summary.cpu_share.iloc[-1])
    return {"cpu_cores": available_cores(), "cpu_share": None if math.isnan(share) else round(share, 4),
            "starved": is_starved(share, threshold)}


def _progress_note(method: str, answers: AnswerFile, baselines: AnswerFile) -> str:
    row = summarize(method, list(answers.records.values()), baselines.records, ci_samples=0).iloc[-1]
    return f"speedup {row.speedup:.2f}x  accepted/step {row.mean_accepted_tokens:.2f}"

