"""Where the reference code runs: side virtual environments made once in $SPECBENCH_CACHE (default
~/.cache/specbench) with --system-site-packages, so they reuse this machine's torch, the pinned packages installed
with --no-deps and only the dependencies their code paths need added; the upstream checkouts they run; the target's
folder in the spelling older transformers read; and a driver of bench/parity/sides/ run there on a job file. #MAT
is a count, so machine load does not matter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.artifacts import PROJECT_ROOT, cache_dir
from bench.models import dequantized_gguf

SIDES = Path(__file__).with_name("sides")


@dataclass(frozen=True)
class SideEnvironment:
    """$SPECBENCH_CACHE/<folder>, made on first use with `pins` (recorded in it; a change remakes it). With `build`
    (what building pinned source distributions needs), those are installed first and the pins built against this
    machine's packages (no build isolation)."""

    folder: str
    pins: tuple[str, ...]
    build: tuple[str, ...] = ()

    def python(self) -> Path:
        venv = cache_dir() / self.folder
        python, stamp = venv / "bin" / "python", venv / "specbench-pins.txt"
        if stamp.exists() and stamp.read_text() == "\n".join(self.build + self.pins):
            return python
        print(f"making the side environment {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(venv)], check=True)
        isolation = []
        if self.build:
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *self.build], check=True)
            isolation = ["--no-build-isolation"]
        env = {**os.environ, "CMAKE_ARGS": f"-DPython_EXECUTABLE={python}"}  # cmake would find the system's python
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *isolation, *self.pins],
                       check=True, env=env)
        side_torch = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], check=True,
                                    capture_output=True, text=True).stdout.strip()
        if side_torch != torch.__version__:
            raise RuntimeError(f"the side environment's torch is {side_torch}, not this one's {torch.__version__}")
        stamp.write_text("\n".join(self.build + self.pins))
        return python

    def run(self, driver: str, job: dict, work: Path):
        """What `driver` writes for `job` (run_driver) in this environment."""
        return run_driver(self.python(), driver, job, work)

    def runs(self, driver: str, job: dict, runs: list[dict], work: Path) -> list:
        """What `driver` gives for each of `runs` (the settings its runners take; equal ones run once), all in one
        job: {**job, "runs": [{"name", ...run}]}."""
        names = {json.dumps(run, sort_keys=True): f"run{index}" for index, run in enumerate(runs)}
        outputs = self.run(driver, {**job, "runs": [{**json.loads(key), "name": name} for key, name in names.items()]},
                           work)
        return [outputs[names[json.dumps(run, sort_keys=True)]] for run in runs]


@dataclass(frozen=True)
class Checkout:
    """Upstream code a side runs: $SPECBENCH_CACHE/<folder>, or the folder `--checkout <name>=DIR` names; it must
    hold `marker`, else the run stops, saying how to get it (`get`, with {dir})."""

    name: str
    folder: str
    marker: str
    get: str

    def path(self, given: Mapping[str, str]) -> Path:
        path = Path(given[self.name]).expanduser() if self.name in given else cache_dir() / self.folder
        if not (path / self.marker).exists():
            raise SystemExit(f"no {self.marker} in {path}: {self.get.format(dir=path)} (or --checkout "
                             f"{self.name}=DIR)")
        return path


# lade 0.0.2 imports `_expand_mask` from transformers' Llama and patches its `greedy_search`: transformers <= 4.34.
# transformers 4.34.1 needs tokenizers < 0.15 and huggingface_hub < 1.0. The packages' other declared dependencies
# (fschat, gradio, accelerate==0.21, ...) are not used by the code run here. (lookahead, medusa, eagle)
UPSTREAM_PACKAGES = SideEnvironment("upstream-venv", ("lade==0.0.2", "medusa-llm==0.1", "eagle-llm==1.2.1",
                                                      "transformers==4.34.1", "tokenizers==0.14.1",
                                                      "huggingface_hub==0.17.3"))
# Spec-Bench's requirements.txt pins transformers 4.37.1 (its SAMD patches LlamaModel.forward of that version);
# tokenizers and huggingface_hub are the newest that version allows. (recycling, samd)
SPEC_BENCH = SideEnvironment("spec-bench-venv", ("transformers==4.37.1", "tokenizers==0.15.2",
                                                 "huggingface_hub==0.20.3"))
SPEC_BENCH_WARMUP = 3  # evaluation/eval.py: both turns of the first question, 3 times, before the counted ones
SPEC_BENCH_CHECKOUT = Checkout("spec-bench", "spec-bench", "model/samd/samd_model.py",
                               "git clone https://github.com/hemingkx/Spec-Bench {dir}")


def run_driver(python: Path, driver: str, job: dict, work: Path):
    """What bench/parity/sides/<driver>.py writes when `python` runs it on `job`, from the project's folder:
    `python <driver> JOB.json OUT.json`."""
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{driver}.json").write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    subprocess.run([str(python), str(SIDES / f"{driver}.py"), str(work / f"{driver}.json"),
                    str(work / f"{driver}-out.json")], check=True, env=env, cwd=PROJECT_ROOT)
    return json.loads((work / f"{driver}-out.json").read_text())


def rope_theta(config) -> float:
    """The target's rotary base (transformers 5 keeps it in `rope_parameters`): upstream's heads read `rope_theta`
    from their own config.json and fall back to 10000, which is not SmolLM2's."""
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def transformers4_folder(source: Path, out: Path, linked: Iterable[str] | None = None) -> Path:
    """`source` (a model folder) in `out` with its config.json in transformers 4's spelling (rope_theta at top
    level), the files `linked` (default: all the others) linked."""
    config = json.loads((source / "config.json").read_text())
    rope = config.pop("rope_parameters", None) or {}
    config.update(rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)), rope_scaling=None,
                  torch_dtype="float32")
    config.setdefault("architectures", ["LlamaForCausalLM"])  # eagle-llm picks its model class from it
    config.pop("dtype", None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in linked or [f.name for f in source.iterdir() if f.name != "config.json"]:
        if not (out / name).exists():
            (out / name).symlink_to((source / name).resolve())
    return out


def side_model_dir(model_cfg) -> Path:
    """The dequantized model folder with a config.json that transformers 4.34 reads, the weights a link to
    bench/models.py's copy."""
    source = dequantized_gguf(model_cfg)
    return transformers4_folder(source, cache_dir() / "upstream" / source.name, linked=["model.safetensors"])
