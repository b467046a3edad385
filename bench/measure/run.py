"""One benchmark run: every question of a task answered by a method and, interleaved, by its baseline, with our
engine (backend=engine) or a serving engine (backend=server); the protocol is bench/measure/protocol.py's."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig

from bench.config import fold_deprecated
from bench.errors import ConfigError
from bench.measure.backends.engine import EngineBackend
from bench.measure.backends.server import ServerBackend, check_server_config
from bench.measure.contention import available_cores, machine_load, start_warnings
from bench.measure.protocol import InterleavedRun
from bench.models import load_model, load_tokenizer, resolve_device
from bench.records import writing_folder
from bench.run_folder import claim_folder
from bench.settings import RunSettings, compile_choice
from bench.validate import validate
from tasks import load_questions
from tasks.prompts import set_prompt_format


def run(cfg: DictConfig, settings: RunSettings | None = None) -> pd.DataFrame | None:
    """Run `cfg.method` (or `cfg.server`'s speculation) on `cfg.task`; writes answers.jsonl, baseline.jsonl,
    summary.csv, meta.json to out_dir, and skipped.jsonl for questions too long for the model's context window.
    `settings`: cfg's, where the caller has validated it already (else validated here). Returns the summary (None:
    no answers)."""
    started = time.time()
    with writing_folder(Path(cfg.out_dir)):
        claim_folder(Path(cfg.out_dir), cfg)  # before anything loads: a folder of other settings is refused
        return run_in_folder(cfg, settings, started)


def run_in_folder(cfg: DictConfig, settings: RunSettings | None, started: float) -> pd.DataFrame | None:
    """run's body, while it holds out_dir's writer lock."""
    backend = cfg.get("backend", "engine")
    if backend == "server":  # a serving engine over HTTP (docs/serving.md)
        check_server_config(cfg)
        return run_server(settings or validate(fold_deprecated(cfg)), cfg, started)
    if backend != "engine" or cfg.get("server") is not None:
        raise ConfigError(f"backend={backend} with server={(cfg.get('server') or {}).get('name')}: use backend=engine "
                          f"(our engine, no server=...) or backend=server with server=<conf/server/ name>")
    settings = settings or validate(fold_deprecated(cfg))
    device = resolve_device(settings.device)
    warned = start_warnings(torch.get_num_threads(), available_cores(), machine_load(), device.type == "cuda")
    for warning in warned:
        print(f"WARNING: {warning}", file=sys.stderr)
    questions = load_questions(cfg.task)  # before the model: a bad task file is refused at once
    model, tokenizer = load_model(cfg.model, device)
    engine = EngineBackend(settings, cfg, model, tokenizer, device, len(questions), warned)
    why = compile_choice(cfg)[1]
    if why:  # engine.compile=auto's choice
        print(f"engine.compile=auto: {why}", file=sys.stderr)
    engine.compile_for(questions)  # before the run's keys are read: a failed compile runs eager, under eager's keys
    return InterleavedRun(settings, engine, started).run(questions)


def run_server(settings: RunSettings, cfg: DictConfig, started: float) -> pd.DataFrame | None:
    """Run the task against `cfg.server` (launching its servers where configured); returns the summary."""
    questions = load_questions(cfg.task)
    tokenizer = load_tokenizer(cfg.model)  # our template renders every prompt; no weights are loaded
    set_prompt_format(tokenizer, settings.model.prompt_format, cfg.model.get("chat_template"))
    return InterleavedRun(settings, ServerBackend(settings, cfg, tokenizer), started).run(questions)
