"""`backend=server`: every question of a task sent to a serving engine's speculative endpoint and, interleaved, to
its baseline without speculation, `server.concurrency` questions in flight; written in our engine's layout
(answers.jsonl, baseline.jsonl, summary.csv, meta.json) so reports and the regression gate read it unchanged."""
from __future__ import annotations

import json
import math
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from bench.artifacts import package_dir
from bench.errors import ConfigError
from bench.measure.gpu import GpuMonitor
from bench.measure.metrics import speedup_text, summarize
from bench.measure.provenance import run_metadata
from bench.measure.serving.launch import LaunchedServer, check_binary
from bench.measure.serving.sides import SERVER_KEYS, ServerSide
from bench.measure.serving.stats import serving_columns
from bench.measure.serving.stream import ENDPOINT_PATHS, RequestSpec
from bench.models import load_tokenizer
from bench.records import AnswerFile, answer_record, config_key
from tasks import load_questions, task_of
from tasks.prompts import build_prompt, set_prompt_format

ENGINES = ("llamacpp", "vllm", "sglang", "generic")
NO_LOGITS = "a server returns no logits here, so whether this is a numeric tie cannot be told"
CLOSING_COLUMNS = ["task", "n_questions", "concurrency", "tokens_per_s", "baseline_tokens_per_s", "speedup",
                   "mean_accepted_tokens", "exact_match", "ttft_p50_s", "itl_p50_s", "e2e_p50_s",
                   "output_tokens_per_s"]


def check_server_config(cfg: DictConfig) -> None:
    """ConfigError listing what a server run cannot use."""
    server, problems = cfg.get("server"), []
    if server is None:
        raise ConfigError("backend=server needs a server config: server=llamacpp_ngram | vllm | sglang (conf/server/)")
    if server.engine not in ENGINES:
        problems.append(f"server.engine={server.engine}: must be one of {', '.join(ENGINES)}")
    if server.endpoint not in ENDPOINT_PATHS:
        problems.append(f"server.endpoint={server.endpoint}: must be one of {', '.join(ENDPOINT_PATHS)}")
    if not server.url:
        problems.append("server.url=null: set it to the speculative server's address (http://host:port)")
    if int(server.concurrency) < 1:
        problems.append(f"server.concurrency={server.concurrency}: must be >= 1")
    if cfg.baseline and server.speculative and not server.baseline_url:
        problems.append("server.baseline_url=null: set it to the same engine without speculation, or baseline=false")
    if cfg.method.get("drafter") is not None:
        problems.append(f"method={cfg.method.name} is our engine's; with backend=server the speculation is the "
                        f"server's (server.name names it): drop method=...")
    if problems:
        raise ConfigError("\n".join(problems))


def run_server(cfg: DictConfig) -> pd.DataFrame | None:
    """Run `cfg.task` against `cfg.server` (launching its servers where configured); returns the summary."""
    started = time.time()
    check_server_config(cfg)
    questions = load_questions(cfg.task)
    tokenizer = load_tokenizer(cfg.model)  # our template renders every prompt; no weights are loaded
    set_prompt_format(tokenizer, cfg.model.get("prompt_format", "auto"), cfg.model.get("chat_template"))
    bench = ServerRun(cfg, tokenizer)
    todo = [q for q in questions if q["question_id"] not in bench.answers]
    with ExitStack() as servers:
        bench.start(servers)
        try:
            bench.decode(todo)
        finally:  # also after an interruption: summarise what is done
            summary = bench.finish(started)
    bench.print_closing(summary)
    return summary


def launch_command(cfg: DictConfig, command: str) -> str:
    """A launch command with {binary} (server.binary, checked to exist) and {model_file} (the model's GGUF)."""
    server = cfg.server
    binary = str(Path(server.binary).expanduser()) if server.binary else ""
    model_file = ""
    if "{model_file}" in command:
        folder = package_dir(cfg.model.package, cfg.model.install_hint) if cfg.model.get("package") else cfg.model.path
        model_file = str(Path(folder) / (cfg.model.get("gguf_file") or ""))
    filled = command.format(binary=binary, model_file=model_file)
    check_binary(filled, server.build_hint)
    return filled


def run_keys(cfg: DictConfig) -> tuple[str, str]:
    """(baseline's key, the method's key): what decides each side's outputs."""
    server = OmegaConf.to_container(cfg.server, resolve=True)
    setting = {"model": OmegaConf.to_container(cfg.model, resolve=True), "backend": "server",
               "gen": OmegaConf.to_container(cfg.gen, resolve=True), "seed": cfg.seed,
               "source": OmegaConf.to_container(cfg.task.source, resolve=True),
               "request": {k: server[k] for k in ("engine", "model", "endpoint", "extra_body", "concurrency")}}
    base = config_key(**setting, server=[server["baseline_url"], server["baseline_launch"]])
    method = config_key(**setting, server=[server["url"], server["launch"], server["name"], server["speculative"]])
    return base, method


class ServerRun:
    """One server run's sides (speculative and baseline), answer files and steps."""

    def __init__(self, cfg: DictConfig, tokenizer):
        self.cfg, self.tokenizer, server = cfg, tokenizer, cfg.server
        self.concurrency = int(server.concurrency)
        self.method = server.name
        self.is_vanilla = not server.speculative
        spec = RequestSpec(server.endpoint, server.model, int(cfg.gen.max_new_tokens), float(cfg.gen.temperature),
                           list(cfg.gen.stop_strings), OmegaConf.to_container(server.extra_body, resolve=True),
                           float(server.timeout_s))
        one = self.concurrency == 1
        self.side = ServerSide(server.url, "server.url", spec, tokenizer, server.engine, bool(server.speculative),
                               server.metrics_path, one)
        self.base_side = None if self.is_vanilla or not cfg.baseline else ServerSide(
            server.baseline_url, "server.baseline_url", spec, tokenizer, server.engine, False, None, one)
        self.baseline_key, method_key = run_keys(cfg)
        out_dir = Path(cfg.out_dir)
        self.answers = AnswerFile(out_dir / "answers.jsonl", method_key, strict=True)
        self.baselines = self.answers if self.is_vanilla else AnswerFile(out_dir / "baseline.jsonl",
                                                                         self.baseline_key, strict=False)
        self.counters_before = self.run_counters = None
        self.launched: list[str] = []

    def start(self, servers: ExitStack) -> None:
        """Launch the configured servers (stopped when `servers` closes), check each side answers, warm both up
        (one untimed short request) and read the speculative side's counters before the run."""
        server, out_dir = self.cfg.server, Path(self.cfg.out_dir)
        for side, command, log in ((self.side, server.launch, "server.log"),
                                   (self.base_side, server.baseline_launch, "baseline_server.log")):
            if side is None:
                continue
            if command:
                filled = launch_command(self.cfg, command)
                self.launched.append(filled)
                servers.enter_context(LaunchedServer(filled, side.url, server.health_path, out_dir / log,
                                                     float(server.ready_timeout_s)))
            side.probe(server.health_path)
            if self.cfg.warmup_tokens:
                hello = [{"role": "user", "content": "Hello"}]
                side.ask(build_prompt(self.tokenizer, hello), hello, self.cfg.seed, int(self.cfg.warmup_tokens))
        self.counters_before = self.side.counters()
        if self.counters_before is not None:
            print(f"WARNING: acceptance counters of {self.side.url}{server.metrics_path} are server-wide: any other "
                  f"traffic to that server during this run is counted too", file=sys.stderr)

    def answer_group(self, side: ServerSide, group: list[dict]) -> tuple[list[list[dict]], dict]:
        """Every question of the group answered by `side`, `concurrency` in flight; the group's wall time."""
        seeds = [self.cfg.seed + q["question_id"] for q in group]
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            results = list(pool.map(side.answer, group, seeds))
        wall = time.perf_counter() - started
        if len(group) > 1:
            share_group_time(results, wall)
        return results, {"id": uuid.uuid4().hex, "wall_s": wall, "concurrency": self.concurrency, "size": len(group)}

    def decode(self, todo: list[dict]) -> None:
        """`concurrency` questions at a time, the baseline's answers to the same questions interleaved (it goes
        first every other group, so neither side always runs second)."""
        for number, start in enumerate(range(0, len(todo), self.concurrency)):
            group = todo[start : start + self.concurrency]
            need_base = self.base_side is not None and any(q["question_id"] not in self.baselines for q in group)
            base = self.answer_group(self.base_side, group) if need_base and number % 2 == 0 else None
            ours = self.answer_group(self.side, group)
            if need_base and base is None:
                base = self.answer_group(self.base_side, group)
            for index, question in enumerate(group):
                self.store_answer(question, ours[0][index], ours[1],
                                  None if base is None else (base[0][index], base[1]))
            print(f"{self.method} on {self.cfg.task.name}: {start + len(group)}/{len(todo)} questions",
                  file=sys.stderr)

    def store_answer(self, question: dict, turns: list[dict], group: dict, base: tuple | None) -> None:
        """Append the question's record (and its baseline's), with exact_match against the baseline at greedy."""
        if base is not None and question["question_id"] not in self.baselines:
            self.baselines.append(server_record(question, self.cfg.model.name, "vanilla", self.baseline_key, *base))
        record = server_record(question, self.cfg.model.name, self.method, self.answers.run_key, turns, group)
        if float(self.cfg.gen.temperature) > 0:
            record["exact_match"], record["divergence"] = None, None
        elif self.is_vanilla:
            record["exact_match"], record["divergence"] = True, None
        elif question["question_id"] in self.baselines:
            base_ids = self.baselines.records[question["question_id"]]["choices"][0]["token_ids"]
            record["divergence"] = locate_divergence([t["token_ids"] for t in turns], base_ids)
            record["exact_match"] = record["divergence"] is None
        self.answers.append(record)

    def finish(self, started: float) -> pd.DataFrame | None:
        """summary.csv and meta.json of what is answered so far; returns the summary (None: no answers)."""
        cfg, out_dir = self.cfg, Path(self.cfg.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        after = self.side.counters() if self.counters_before is not None else None
        self.run_counters = None if after is None else (after - self.counters_before).as_dict()
        summary = server_summary(self.method, list(self.answers.records.values()), self.baselines.records, cfg,
                                 self.run_counters) if self.answers.records else None
        if summary is not None:
            summary.to_csv(out_dir / "summary.csv", index=False)
        (out_dir / "meta.json").write_text(json.dumps(self.metadata(started), indent=2) + "\n")
        return summary

    def metadata(self, started: float) -> dict:
        """meta.json: our engine's provenance keys, with config.method standing for the server's speculation (so
        reports label and pair it as a method) and the server's facts: backend, urls, launch commands, engine."""
        cfg, server = self.cfg, self.cfg.server
        cpu = torch.device("cpu")
        meta = run_metadata(cfg, cpu, started, GpuMonitor(cpu))
        meta["config"]["method"] = {"name": self.method, "drafter": None if self.is_vanilla else
                                    {"server": server.engine, "url": server.url, "launch": server.launch}}
        meta.update({"device": f"server:{server.engine}", "device_name": f"{server.engine} at {server.url}",
                     "dtype": server.dtype or "unknown", "cpu_threads": None, "backend": "server",
                     "server": {"engine": server.engine, "url": server.url, "baseline_url": server.baseline_url,
                                "endpoint": server.endpoint, "model": server.model,
                                "concurrency": self.concurrency, "launch": server.launch,
                                "baseline_launch": server.baseline_launch, "launched": self.launched,
                                "acceptance_counters": self.run_counters},
                     "run_key": self.answers.run_key, "baseline_run_key": self.baseline_key,
                     "skipped_questions": [], "start_warnings": [], "profile": None,
                     "cpu_share": None, "starved": None})
        return meta

    def print_closing(self, summary: pd.DataFrame | None) -> None:
        print(f"\n{self.method} ({self.cfg.server.engine} at {self.cfg.server.url}) on {self.cfg.task.name}, "
              f"concurrency {self.concurrency} -> {self.cfg.out_dir}")
        if summary is None:
            return
        shown = summary[CLOSING_COLUMNS].copy()
        shown["speedup"] = [speedup_text(*v) for v in zip(summary.speedup, summary.speedup_ci_low,
                                                          summary.speedup_ci_high)]
        print(shown.rename(columns={"speedup": "speedup (95% CI)"}).to_string(index=False,
                                                                             float_format=lambda x: f"{x:.3f}"))


def share_group_time(results: list[list[dict]], wall: float) -> None:
    """Requests answered together: each turn's wall_time becomes its share of the group's wall time (its tokens over
    the group's), as batched rows of our engine get theirs, so a question's tokens/s is the group's throughput;
    `latency` keeps the request's own end-to-end seconds."""
    total = sum(len(turn["token_ids"]) for turns in results for turn in turns) or 1
    for turns in results:
        for turn in turns:
            turn["wall_time"] = wall * len(turn["token_ids"]) / total
            turn["wall_times"] = [turn["wall_time"]]


def server_record(question: dict, model_id: str, method: str, run_key: str, turns: list[dict], group: dict) -> dict:
    """records.answer_record's line plus the serving fields per turn (SERVER_KEYS) and the request group."""
    record = answer_record(question, model_id, method, run_key, turns)
    record["choices"][0].update({key: [t[key] for t in turns] for key in SERVER_KEYS}, group=group)
    return record


def locate_divergence(turns: list[list[int]], baseline: list[list[int]]) -> dict | None:
    """Where a turn's token ids first leave the baseline's (None: all equal). Without logits no tie can be proven:
    numeric_tie is false and logit_gap null, with the reason."""
    for index, (ids, base) in enumerate(zip(turns, baseline)):
        if ids == base:
            continue
        shorter = min(len(ids), len(base))
        position = next((i for i, (a, b) in enumerate(zip(ids, base)) if a != b), shorter)
        found = {"turn": index, "position": position, "logit_gap": None, "numeric_tie": False}
        if position < shorter:
            return {**found, "vanilla_token": base[position], "method_token": ids[position], "reason": NO_LOGITS}
        return {**found, "reason": "one side stopped earlier: stop rules differ, never a tie"}
    return None


def server_summary(method: str, records: list[dict], baselines: dict[int, dict], cfg: DictConfig,
                   counters: dict | None) -> pd.DataFrame:
    """metrics.summarize's rows (speedup, #MAT, acceptance, exact_match) with the serving columns per task
    (bench/measure/serving/stats.py) and the engine's run-wide acceptance length where its counters tell one."""
    summary = summarize(method, records, baselines, starvation_threshold=cfg.starvation_threshold,
                        ci_samples=cfg.bootstrap.samples, ci_seed=cfg.bootstrap.seed)
    summary.insert(2, "concurrency", int(cfg.server.concurrency))
    rows = []
    for task in summary.task:
        chosen = [r for r in records if task == "overall" or task_of(r["category"]) == task]
        paired = [baselines[r["question_id"]] for r in chosen if r["question_id"] in baselines]
        rows.append(serving_columns(chosen, paired))
    extra = pd.DataFrame(rows, index=summary.index)
    length = (counters or {}).get("acceptance_length")
    extra["engine_acceptance_length"] = math.nan if length is None else length
    return pd.concat([summary, extra], axis=1)
