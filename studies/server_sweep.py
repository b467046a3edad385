"""A serving engine's concurrency sweep with its servers launched once: the harness's launcher starts the speculative
server and its baseline (as `python -m bench backend=server server=<name>` would, for every point of a sweep), then
`python -m bench -m ... server.reuse_running=true server.concurrency=<list>` runs each concurrency against them
(records and labels as launched runs: the launch commands stay in the config), then both stop. Throughput
speedup per concurrency lands in the report's batch table and plot (a server run's batch size is its concurrency).

    python -m studies.server_sweep --server vllm_cpu_ngram --concurrency 1,2,4,8 -- task=all task.limit=2

Arguments after `--` go to every run. Launch lines and server logs: <out>/<server>/server.log, baseline_server.log.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config
from bench.measure.serving.launch import LaunchedServer, launch_command, launch_environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.server_sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="a conf/server/<name>.yaml with launch commands")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--logs", type=Path, default=PROJECT_ROOT / "results" / "server_sweeps")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (after --)")
    args = parser.parse_args(argv)
    shared = ["backend=server", f"server={args.server}", *args.overrides]
    cfg = compose_config(*shared)
    server, logs, env = cfg.server, args.logs / args.server, launch_environment(cfg)
    with ExitStack() as servers:
        for command, url, log in ((server.launch, server.url, "server.log"),
                                  (server.baseline_launch, server.baseline_url, "baseline_server.log")):
            filled = launch_command(cfg, command)
            print(f"launching {url}: {filled}", flush=True)
            servers.enter_context(LaunchedServer(filled, url, server.health_path, logs / log,
                                                 float(server.ready_timeout_s), env))
        sweep = [sys.executable, "-m", "bench", "-m", *shared, "server.reuse_running=true",
                 f"server.concurrency={args.concurrency}"]
        print("$ " + " ".join(sweep[1:]), flush=True)
        return subprocess.run(sweep, cwd=PROJECT_ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
