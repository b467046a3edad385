"""`python -m bench.profile model=<m> [device=...] [gen.batch_size=B] [profile.force=true]`: measure the target's
forward time t(L, c).

Times one target forward over L = profile.lengths new tokens after profile.contexts cached tokens, for
gen.batch_size sequences at once (median of profile.repeats), on the device, dtype and torch threads a run would
use, both as a chain (the model's own causal mask) and as a tree step (a tree-shaped 4-D mask), and stores it as
JSON in profile.dir keyed by that setting (bench/planning/costmodel.py: `seconds` and `tree_seconds`, named in
`point_kinds`). Runs read it for their predicted speedup; `method.sizing=auto` makes it when missing. Time it on a
quiet machine: a profile taken under load mispredicts every run.

A run whose forwards are compiled (engine.compile, as `bench.settings.compile_choice` decides for the same overrides)
reads a profile of compiled forwards, keyed `compiled` and measured through the compiled engine's own forward (its
buckets, its static cache): the times its predictions and its planner need are that engine's, not eager's.
"""
from __future__ import annotations

import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from bench.blas import BLAS_ENVIRONMENT
from bench.engine.kvcache import attention_windows, new_cache, tree_attention_mask
from bench.engine.timing import device_time
from bench.engine.tree import DraftTree
from bench.models import context_window
from bench.planning.costmodel import POINT_KINDS, Profile, ProfileError, profile_path
from bench.settings import compile_choice


def batch_size(cfg: DictConfig) -> int:
    return int(cfg.gen.get("batch_size", 1))


def compiled_forwards(cfg: DictConfig, compiled: bool | None) -> bool:
    """`compiled`, or (None) whether engine.compile compiles a run of `cfg`."""
    return compile_choice(cfg)[0] if compiled is None else compiled


def find_profile(cfg: DictConfig, device: torch.device, compiled: bool | None = None) -> Profile:
    """The stored profile for this run's setting (at gen.batch_size, compiled or eager), wherever it was measured: on
    this host, or on another of the same device model (profile_origin says which); ProfileError (with the command
    that makes it) otherwise."""
    compiled = compiled_forwards(cfg, compiled)
    setting = profile_setting(cfg.model, device, batch=batch_size(cfg), compiled=compiled)
    return Profile.load(profile_path(cfg.profile.dir, setting), setting, setting_command(cfg, device, compiled))


def setting_command(cfg: DictConfig, device: torch.device, compiled: bool | None = None) -> str:
    """The command that measures the profile of this run's setting on this host."""
    return profile_command(cfg.model.name, device, profile_setting(cfg.model, device)["threads"], batch_size(cfg),
                           compiled_forwards(cfg, compiled))


def profile_origin(cfg: DictConfig, profile: Profile) -> dict:
    """meta.json's `profile_origin`: the profile's file, the host and time it was measured (host null in profiles
    made before they recorded it), whether that host is this one, and its device model."""
    return {"file": str(profile_path(cfg.profile.dir, profile.setting)), "host": profile.host,
            "this_host": profile.host == socket.gethostname(), "measured": profile.measured,
            "device_name": profile.setting["device_name"]}


def origin_text(origin: dict) -> str:
    """`<file>, measured on this host (<when>)`, or on which other host of the same device model."""
    if origin["this_host"]:
        return f"{origin['file']}, measured on this host ({origin['measured']})"
    host = f"host {origin['host']}" if origin["host"] else "a host it does not name"
    return f"{origin['file']}, measured on {host} ({origin['measured']}) with this host's {origin['device_name']}"


def profile_note(origin: dict | None, uses: str, command: str) -> str:
    """The run's one line on the profile behind `uses` (its predicted_speedup, its method.sizing=auto): where it was
    measured, and the command that measures this host's where it was not here."""
    if origin is None:
        return f"{uses}: NaN, no forward-time profile for this setting; measure one with: {command}"
    line = f"{uses} from the forward-time profile {origin_text(origin)}"
    return line if origin["this_host"] else f"{line}; this host's: {command} profile.force=true"


def make_profile(cfg: DictConfig, model, device: torch.device, compiled: bool | None = None) -> Profile:
    """Measure and store the profile for this setting (progress bar on stderr); returns it."""
    compiled = compiled_forwards(cfg, compiled)
    setting = profile_setting(cfg.model, device, batch=batch_size(cfg), compiled=compiled)
    lengths = sorted(set(int(n) for n in cfg.profile.lengths))
    window = context_window(model)
    contexts = sorted(set(int(c) for c in cfg.profile.contexts
                          if window is None or c + max(lengths) <= window))
    if not contexts:
        raise ProfileError(f"no profile.contexts fit in the model's context window of {window} tokens")
    with tqdm(total=cfg.profile.repeats, desc=f"profiling {cfg.model.name}", unit="round", dynamic_ncols=True) as bar:
        seconds = measure_forward_times(model, lengths, contexts, cfg.profile.repeats, progress=bar,
                                        batch=batch_size(cfg), compiled=compiled)
    profile = Profile(setting, lengths, contexts, seconds["chain"], cfg.profile.repeats,
                      time.strftime("%Y-%m-%dT%H:%M:%S"), seconds["tree"], POINT_KINDS, socket.gethostname())
    profile.save(profile_path(cfg.profile.dir, setting))
    return profile


def profile_for_run(cfg: DictConfig, model, device: torch.device, make: bool,
                    compiled: bool | None = None) -> Profile | None:
    """The run's profile (of compiled forwards where `compiled`; None: as engine.compile decides): the stored one;
    if none fits, a new one when `make`, else None."""
    try:
        return find_profile(cfg, device, compiled)
    except ProfileError as err:
        if not make:
            print(f"note: {err} (predicted speedups are left out)", file=sys.stderr)
            return None
        print(f"note: {err}; measuring it now", file=sys.stderr)
        return make_profile(cfg, model, device, compiled)


def print_profile(profile: Profile) -> None:
    setting = profile.setting
    batch = f"batch {setting['batch']}, " if "batch" in setting else ""
    compiled = "compiled, " if setting.get("compiled") else ""
    print(f"t(L) in ms per context, chains and tree steps ({batch}{compiled}{setting['model']}, "
          f"{setting['device_name']}, {setting['dtype']}, threads {setting['threads']}):")
    tables = {"chain": profile.seconds, "tree": profile.tree_seconds}
    for kind, table in tables.items():
        if table is not None:
            print(f"{kind:<7} " + " ".join(f"{'L=' + str(n):>8}" for n in profile.lengths))
            for context, row in zip(profile.contexts, table):
                print(f"{context:>7} " + " ".join(f"{s * 1e3:8.1f}" for s in row))
    print("t(L)/t(1) at the shortest context: " + " ".join(f"{r:.2f}" for r in profile.relative()))


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = cpuinfo.read_text().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        name = names[0] if names else name
    return name


def blas_environment(device: torch.device) -> dict:
    """The BLAS_ENVIRONMENT variables that are set, on a CPU (they change its forward times, so profiles and runs
    record them); {} on a GPU."""
    if device.type != "cpu":
        return {}
    return {name: os.environ[name] for name in BLAS_ENVIRONMENT if os.environ.get(name)}


def profile_setting(model_cfg, device: torch.device, threads: int | None = None, batch: int = 1,
                    compiled: bool = False) -> dict:
    """What a profile's times depend on (model and its weights file, dtype, attention implementation, device, threads,
    BLAS code path, torch version, compiled forwards or eager); a profile is only used where this matches exactly.
    `batch`: sequences per forward (a batch-B profile times [B, L] forwards after B cached contexts; batch 1 keeps no
    key, as before); `blas`: the BLAS code-path variables when any is set (none set keeps no key); `compiled`: the
    compiled engine's forwards (eager keeps no key, as before)."""
    blas = blas_environment(device)
    return {**({"batch": batch} if batch > 1 else {}), **({"blas": blas} if blas else {}),
            **({"compiled": True} if compiled else {}),
            "model": model_cfg.name, "path": model_cfg.path, "gguf_file": model_cfg.get("gguf_file"),
            "dtype": model_cfg.dtype, "attn_implementation": model_cfg.get("attn_implementation"),
            "device": device.type, "device_name": device_name(device),
            "threads": None if device.type == "cuda" else (threads or torch.get_num_threads()),
            "torch": torch.__version__}


def profile_command(model_name: str, device: torch.device, threads: int | None, batch: int = 1,
                    compiled: bool = False) -> str:
    parts = [f"python -m bench.profile model={model_name}", f"device={device}"]
    if batch > 1:
        parts.append(f"gen.batch_size={batch}")
    parts.append(f"engine.compile={'on' if compiled else 'off'}")
    if device.type != "cuda" and threads:
        parts.insert(0, f"OMP_NUM_THREADS={threads}")
    parts[:0] = [f"{name}={value}" for name, value in blas_environment(device).items()]
    return " ".join(parts)


def tree_step_inputs(model, length: int, context: int, batch: int) -> dict:
    """position_ids and the additive 4-D mask of a tree step over `length` inputs (the root and a binary tree of
    length - 1 nodes under it) after `context` cached tokens, for `batch` rows alike, as the engines build them."""
    tree = DraftTree([0] * (length - 1), [i // 2 - 1 for i in range(length - 1)])
    offsets = tree.position_offsets.to(model.device)
    mask = tree_attention_mask(tree.local_mask, offsets, context, attention_windows(model), model.dtype)
    rows = lambda m: m.expand(batch, -1, -1, -1)  # noqa: E731
    return {"position_ids": (offsets + context).expand(batch, -1),
            "attention_mask": {k: rows(m) for k, m in mask.items()} if isinstance(mask, dict) else rows(mask)}


@torch.inference_mode()
def measure_forward_times(model, lengths: list[int], contexts: list[int], repeats: int = 5, progress=None,
                          batch: int = 1, kinds: tuple[str, ...] = ("chain", "tree"),
                          clock=None, compiled: bool = False) -> dict[str, list[list[float]]]:
    """{kind: table}: median seconds of a forward over L new tokens (all logits, as a verification step computes
    them) after a cached context of c random tokens, for every c in `contexts` and L in `lengths`, `batch`
    sequences at once; "chain" with the model's own causal mask, "tree" with a tree-shaped 4-D mask
    (`tree_step_inputs`); `compiled`: the compiled engine's forwards (`compiled_points`), each timed right after an
    untimed one of the same point, as a run's steps follow each other (a compiled one-token step right after one of
    128 inputs took 13% longer than one after another of its own, 2026-12-06). Repeats go round-robin over all the
    points of every kind (after one untimed round, which also makes a compiled engine's graphs), so that a machine
    whose speed drifts moves every point alike. `clock`: seconds (default time.perf_counter, read once the device is
    done: bench/engine/timing.py device_time), replaced in tests."""
    device = model.device
    point = (compiled_points if compiled else eager_points)(model, lengths, contexts, batch)
    times = {kind: [[[] for _ in lengths] for _ in contexts] for kind in kinds}
    for repeat in range(repeats + 1):
        for kind in kinds:
            for i in range(len(contexts)):
                for j in range(len(lengths)):
                    if compiled and repeat:
                        point(kind, i, j)  # untimed: the timed one follows a step of its own size
                    start = device_time(device, clock)
                    point(kind, i, j)
                    elapsed = device_time(device, clock) - start
                    if repeat:
                        times[kind][i][j].append(elapsed)
        if progress is not None and repeat:
            progress.update(1)
    return {kind: [[statistics.median(point) for point in row] for row in table] for kind, table in times.items()}


def eager_points(model, lengths: list[int], contexts: list[int], batch: int) -> Callable[[str, int, int], None]:
    """point(kind, i, j): the eager forward of lengths[j] tokens after contexts[i] cached ones (one DynamicCache per
    context, cropped back after each forward)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    ids, caches = [], []
    for context in contexts:
        ids.append(torch.randint(0, vocab, (batch, context + max(lengths)), generator=generator).to(model.device))
        caches.append(new_cache())
        model(input_ids=ids[-1][:, :context], cache=caches[-1], logits_to_keep=1)
    extra = {"chain": [[{} for _ in lengths] for _ in contexts],
             "tree": [[tree_step_inputs(model, n, c, batch) for n in lengths] for c in contexts]}

    def point(kind: str, i: int, j: int) -> None:
        context, length = contexts[i], lengths[j]
        model(input_ids=ids[i][:, context : context + length], cache=caches[i], **extra[kind][i][j])
        caches[i].crop(-length)

    return point


def compiled_points(model, lengths: list[int], contexts: list[int], batch: int) -> Callable[[str, int, int], None]:
    """point(kind, i, j): the compiled engine's verification forward (bench/engine/target.py's CompiledTarget, or at
    batch > 1 bench/engine/batched_compiled.py's StaticBatchCache) of lengths[j] inputs, a chain or a binary tree,
    after contexts[i] cached positions; one cache reserved for the longest point, its first contexts[i] positions
    taken as the context (what they hold does not change a forward's time)."""
    from bench.engine.batched_compiled import StaticBatchCache
    from bench.engine.compiled import BUCKETS
    from bench.engine.target import CompiledTarget

    windows = attention_windows(model)
    if any(window is not None for window in windows.values()):
        raise ProfileError(f"the compiled engine runs {type(model).__name__} (sliding-window layers) eager; measure "
                           f"its profile with engine.compile=off")
    if max(lengths) > BUCKETS[-1]:
        raise ProfileError(f"profile.lengths reach {max(lengths)}; the compiled engine's forwards take at most "
                           f"{BUCKETS[-1]} inputs")
    trees = {"chain": {n: DraftTree.chain([0] * (n - 1)) for n in lengths if n > 1},
             "tree": {n: DraftTree([0] * (n - 1), [i // 2 - 1 for i in range(n - 1)]) for n in lengths if n > 1}}
    positions = max(contexts) + max(lengths)
    if batch == 1:
        target = CompiledTarget(model, (), windows)
        target.reserve(positions)
        target.prefill([0] * max(contexts), max(lengths))
        verify = lambda tree: target.verify(0, tree)  # noqa: E731
    else:
        target = StaticBatchCache(model, ())
        target.reserve(batch, positions)
        target.start([])
        verify = lambda tree: target.verify([0] * batch, [tree] * batch)  # noqa: E731

    def point(kind: str, i: int, j: int) -> None:
        target.hold(contexts[i])
        verify(trees[kind].get(lengths[j]))

    return point
