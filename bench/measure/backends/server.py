"""A serving engine as a backend of the protocol (bench/measure/protocol.py), `backend=server`: each question sent
to the server's speculative endpoint and, as the baseline, to the same engine without speculation, `server.concurrency`
questions in flight (docs/serving.md). The servers are launched where configured; the records carry the serving
fields (latencies, acceptance as the engine reports it) and the summary the serving columns."""
from __future__ import annotations

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

from bench.errors import ConfigError
from bench.measure.exactness import NO_LOGITS, find_divergence
from bench.measure.gpu import GpuMonitor
from bench.measure.protocol import BASELINE, METHOD, Backend, KeyInputs
from bench.measure.provenance import run_metadata
from bench.measure.serving.endpoint import SERVER_KEYS, ServerEndpoint
from bench.measure.serving.launch import LaunchedServer, launch_command, launch_environment
from bench.measure.serving.stats import serving_columns
from bench.measure.serving.stream import ENDPOINT_PATHS, RequestSpec
from bench.models import load_model, resolve_device
from bench.settings import RunSettings
from tasks import task_of
from tasks.prompts import build_prompt

ENGINES = ("llamacpp", "vllm", "sglang", "tgi", "lmdeploy", "mlc_llm", "generic")
CLOSING_COLUMNS = ["task", "n_questions", "concurrency", "tokens_per_s", "baseline_tokens_per_s", "speedup",
                   "mean_accepted_tokens", "exact_match", "ttft_p50_s", "itl_p50_s", "e2e_p50_s",
                   "output_tokens_per_s"]


def check_server_config(cfg: DictConfig) -> None:
    """ConfigError listing what a server run cannot use."""
    server, problems = cfg.get("server"), []
    if server is None:
        raise ConfigError("backend=server needs a server config: server=llamacpp_ngram | vllm | sglang | tgi | "
                          "lmdeploy | mlc_llm (conf/server/)")
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


def server_key_inputs(cfg: DictConfig) -> KeyInputs:
    """What decides a server run's outputs: model, generation settings, seed, question source and the request; for
    each side its server (url and launch command; the method's also its name and whether it speculates)."""
    server = OmegaConf.to_container(cfg.server, resolve=True)
    shared = {"model": OmegaConf.to_container(cfg.model, resolve=True), "backend": "server",
              "gen": OmegaConf.to_container(cfg.gen, resolve=True), "seed": cfg.seed,
              "source": OmegaConf.to_container(cfg.task.source, resolve=True),
              "request": {k: server[k] for k in ("engine", "model", "endpoint", "extra_body", "concurrency")}}
    return KeyInputs(shared, baseline={"server": [server["baseline_url"], server["baseline_launch"]]},
                     method={"server": [server["url"], server["launch"], server["name"], server["speculative"]]})


class ServerBackend(Backend):
    """The speculative endpoint (server.url) and its baseline's (server.baseline_url), `concurrency` requests in
    flight, and the speculative server's acceptance counters over the run. Reads the run's typed `settings`, and
    `server.*` of `cfg`, the composed config they were made from (which also is hashed and dumped to meta.json)."""

    def __init__(self, settings: RunSettings, cfg: DictConfig, tokenizer):
        self.settings, self.cfg, self.tokenizer, server = settings, cfg, tokenizer, cfg.server
        self.group_size, self.group_column = int(server.concurrency), "concurrency"
        self.label, self.engine = server.name, server.engine
        self.method_is_baseline = not server.speculative
        self.key_inputs = server_key_inputs(cfg)
        gen = settings.generation
        spec = RequestSpec(server.endpoint, server.model, gen.max_new_tokens, gen.temperature, list(gen.stop_strings),
                           OmegaConf.to_container(server.extra_body, resolve=True), float(server.timeout_s))
        one = self.group_size == 1
        self.endpoints = {METHOD: ServerEndpoint(server.url, "server.url", spec, tokenizer, server.engine,
                                                 bool(server.speculative), server.metrics_path, one)}
        if not self.method_is_baseline and settings.baseline:
            self.endpoints[BASELINE] = ServerEndpoint(server.baseline_url, "server.baseline_url", spec, tokenizer,
                                                      server.engine, False, None, one)
        self.counters_before = self.run_counters = self._tie_judge = None
        self.launched: list[str] = []

    def open(self, resources: ExitStack) -> None:
        """Launch the configured servers (stopped when `resources` closes; with server.reuse_running they already
        run) and check that each side answers."""
        server, out_dir = self.cfg.server, Path(self.settings.out_dir)
        env = launch_environment(self.cfg)
        launches = {METHOD: (server.launch, "server.log"), BASELINE: (server.baseline_launch, "baseline_server.log")}
        for side, endpoint in self.endpoints.items():
            command, log = launches[side]
            if command and not server.get("reuse_running"):
                filled = launch_command(self.cfg, command)
                self.launched.append(filled)
                resources.enter_context(LaunchedServer(filled, endpoint.url, server.health_path, out_dir / log,
                                                       float(server.ready_timeout_s), env))
            endpoint.probe(server.health_path)

    def warm_up(self, side: str, todo: list[dict]) -> None:
        """One untimed short request."""
        hello = [{"role": "user", "content": "Hello"}]
        self.endpoints[side].ask(build_prompt(self.tokenizer, hello), hello, self.settings.seed,
                                 self.settings.warmup_tokens)

    def timing_starts(self) -> None:
        """Read the speculative server's counters before the run."""
        method = self.endpoints[METHOD]
        self.counters_before = method.counters()
        if self.counters_before is not None:
            print(f"WARNING: acceptance counters of {method.url}{method.metrics_path} are server-wide: any other "
                  f"traffic to that server during this run is counted too", file=sys.stderr)

    def answer(self, side: str, group: list[dict], seeds: list[int]) -> list[list[dict]]:
        """Every question of the group answered by `side`, `concurrency` in flight; each turn also carries the
        request group (its id, wall time, concurrency and size)."""
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=self.group_size) as pool:
            results = list(pool.map(self.endpoints[side].answer, group, seeds))
        wall = time.perf_counter() - started
        if len(group) > 1:
            share_group_time(results, wall)
        request_group = {"id": uuid.uuid4().hex, "wall_s": wall, "concurrency": self.group_size, "size": len(group)}
        for turns in results:
            for turn in turns:
                turn["group"] = request_group
        return results

    def divergence(self, turns: list[dict], baseline: dict) -> dict | None:
        """Where the two sides' tokens part and, with server.tie_check, whether that is a numeric tie as our engine
        judges one: our copy of the served model (in model.tie_check_dtype, else model.dtype) scores the shared
        prefix, both tokens within model.tie_margin of its top logit. Without it no tie can be told (a server returns
        no logits)."""
        found = find_divergence(None, turns, baseline)
        if found is None or found.get("reason") != NO_LOGITS or not self.cfg.server.get("tie_check"):
            return found
        return find_divergence(self.tie_judge(), turns, baseline, self.settings.model.tie_margin)

    def tie_judge(self):
        """The served model, loaded here once at the first divergence (server.tie_check)."""
        if self._tie_judge is None:
            model = self.cfg.model
            dtype = self.settings.model.tie_check_dtype or model.dtype
            self._tie_judge, _ = load_model(OmegaConf.merge(model, {"dtype": dtype}), resolve_device(self.cfg.device))
        return self._tie_judge

    def choice_fields(self, turns: list[dict]) -> dict:
        """The serving fields per turn (SERVER_KEYS) and the request group."""
        return {**{key: [t[key] for t in turns] for key in SERVER_KEYS}, "group": turns[0]["group"]}

    def timing_ends(self) -> None:
        """The speculative server's counters over the run (None where it has none)."""
        after = self.endpoints[METHOD].counters() if self.counters_before is not None else None
        self.run_counters = None if after is None else (after - self.counters_before).as_dict()

    def summary_columns(self, summary: pd.DataFrame, records: list[dict], baselines: dict[int, dict]
                        ) -> pd.DataFrame:
        """The serving columns per task (bench/measure/serving/stats.py) and the engine's run-wide acceptance
        length where its counters tell one."""
        rows = []
        for task in summary.task:
            chosen = [r for r in records if task == "overall" or task_of(r["category"]) == task]
            paired = [baselines[r["question_id"]] for r in chosen if r["question_id"] in baselines]
            rows.append(serving_columns(chosen, paired))
        extra = pd.DataFrame(rows, index=summary.index)
        length = (self.run_counters or {}).get("acceptance_length")
        extra["engine_acceptance_length"] = math.nan if length is None else length
        return pd.concat([summary, extra], axis=1)

    def provenance(self, started: float) -> dict:
        """Our engine's provenance keys, with config.method standing for the server's speculation (so reports label
        and pair it as a method) and the server's facts: backend, urls, launch commands, engine."""
        cfg, server = self.cfg, self.cfg.server
        cpu = torch.device("cpu")
        meta = run_metadata(cfg, self.settings.model.dtype, cpu, started, GpuMonitor(cpu))
        meta["config"]["method"] = {"name": self.label, "drafter": None if self.method_is_baseline else
                                    {"server": server.engine, "url": server.url, "launch": server.launch}}
        meta.update({"device": f"server:{server.engine}", "device_name": f"{server.engine} at {server.url}",
                     "dtype": server.dtype or "unknown", "cpu_threads": None, "backend": "server",
                     "server": {"engine": server.engine, "url": server.url, "baseline_url": server.baseline_url,
                                "endpoint": server.endpoint, "model": server.model,
                                "concurrency": self.group_size, "launch": server.launch,
                                "baseline_launch": server.baseline_launch, "launched": self.launched,
                                "acceptance_counters": self.run_counters}})
        return meta

    def heading(self) -> str:
        server = self.cfg.server
        return (f"{self.label} ({server.engine} at {server.url}) on {self.settings.task.name}, concurrency "
                f"{self.group_size}")

    def closing_columns(self, summary: pd.DataFrame) -> list[str]:
        return CLOSING_COLUMNS


def share_group_time(results: list[list[dict]], wall: float) -> None:
    """Requests answered together: each turn's wall_time becomes its share of the group's wall time (its tokens over
    the group's), as batched rows of our engine get theirs, so a question's tokens/s is the group's throughput;
    `latency` keeps the request's own end-to-end seconds."""
    total = sum(len(turn["token_ids"]) for turns in results for turn in turns) or 1
    for turns in results:
        for turn in turns:
            turn["wall_time"] = wall * len(turn["token_ids"]) / total
            turn["wall_times"] = [turn["wall_time"]]
