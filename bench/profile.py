"""`python -m bench.profile model=<m> [device=...] [gen.batch_size=B] [profile.force=true]`: measure the target's
forward time t(L, c).

Times one target forward over L = profile.lengths new tokens after profile.contexts cached tokens, for
gen.batch_size sequences at once (median of profile.repeats), on the device, dtype and torch threads a run would
use, both as a chain (the model's own causal mask) and as a tree step (a tree-shaped 4-D mask), and stores it as
JSON in profile.dir keyed by that setting (bench/costmodel.py: `seconds` and `tree_seconds`, named in
`point_kinds`). Runs read it for their
predicted speedup; `method.budget=auto` and `method.batch_policy=adaptive` make it when missing. Time it on a quiet machine: a profile taken under load mispredicts every run.
"""
from __future__ import annotations

import sys
import time

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from bench.costmodel import (POINT_KINDS, Profile, ProfileError, measure_forward_times, profile_command, profile_path,
                             profile_setting)
from bench.models import context_window, load_model, resolve_device


def batch_size(cfg: DictConfig) -> int:
    return int(cfg.gen.get("batch_size", 1))


def find_profile(cfg: DictConfig, device: torch.device) -> Profile:
    """The stored profile for this run's setting (at gen.batch_size); ProfileError (with the command that makes it)
    otherwise."""
    setting = profile_setting(cfg.model, device, batch=batch_size(cfg))
    return Profile.load(profile_path(cfg.profile.dir, setting), setting,
                        profile_command(cfg.model.name, device, setting["threads"], batch_size(cfg)))


def make_profile(cfg: DictConfig, model, device: torch.device) -> Profile:
    """Measure and store the profile for this setting (progress bar on stderr); returns it."""
    setting = profile_setting(cfg.model, device, batch=batch_size(cfg))
    lengths = sorted(set(int(n) for n in cfg.profile.lengths))
    window = context_window(model)
    contexts = sorted(set(int(c) for c in cfg.profile.contexts
                          if window is None or c + max(lengths) <= window))
    if not contexts:
        raise ProfileError(f"no profile.contexts fit in the model's context window of {window} tokens")
    with tqdm(total=cfg.profile.repeats, desc=f"profiling {cfg.model.name}", unit="round", dynamic_ncols=True) as bar:
        seconds = measure_forward_times(model, lengths, contexts, cfg.profile.repeats, progress=bar,
                                        batch=batch_size(cfg))
    profile = Profile(setting, lengths, contexts, seconds["chain"], cfg.profile.repeats,
                      time.strftime("%Y-%m-%dT%H:%M:%S"), seconds["tree"], POINT_KINDS)
    profile.save(profile_path(cfg.profile.dir, setting))
    return profile


def profile_for_run(cfg: DictConfig, model, device: torch.device, make: bool) -> Profile | None:
    """The run's profile: the stored one; if none fits, a new one when `make`, else None."""
    try:
        return find_profile(cfg, device)
    except ProfileError as err:
        if not make:
            print(f"note: {err} (predicted speedups are left out)", file=sys.stderr)
            return None
        print(f"note: {err}; measuring it now", file=sys.stderr)
        return make_profile(cfg, model, device)


def main(argv: list[str] | None = None) -> None:
    from bench.run import compose_config

    cfg = compose_config(*(sys.argv[1:] if argv is None else argv))
    device = resolve_device(cfg.device)
    if not cfg.profile.force:
        try:
            profile = find_profile(cfg, device)
            print(f"a profile for this setting exists ({profile.measured}); profile.force=true remakes it")
            print_profile(profile)
            return
        except ProfileError:
            pass
    model, _ = load_model(cfg.model, device)
    print_profile(make_profile(cfg, model, device))


def print_profile(profile: Profile) -> None:
    setting = profile.setting
    batch = f"batch {setting['batch']}, " if "batch" in setting else ""
    print(f"t(L) in ms per context, chains and tree steps ({batch}{setting['model']}, {setting['device_name']}, "
          f"{setting['dtype']}, threads {setting['threads']}):")
    tables = {"chain": profile.seconds, "tree": profile.tree_seconds}
    for kind, table in tables.items():
        if table is not None:
            print(f"{kind:<7} " + " ".join(f"{'L=' + str(n):>8}" for n in profile.lengths))
            for context, row in zip(profile.contexts, table):
                print(f"{context:>7} " + " ".join(f"{s * 1e3:8.1f}" for s in row))
    print("t(L)/t(1) at the shortest context: " + " ".join(f"{r:.2f}" for r in profile.relative()))


if __name__ == "__main__":
    main()
