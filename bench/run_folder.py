"""A run's folder: the default out_dir names the settings that decide its answers (a readable label and a short
hash of them), so a command with other settings gets a folder of its own and the same command resumes its own. The
settings are kept in the folder (settings.json); a command whose settings differ from a folder's is refused, before
anything loads, in one line naming both."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench import method_identity
from bench.errors import ConfigError
from bench.settings import compile_choice

SETTINGS_FILE = "settings.json"
IDENTITY_KEYS = ("model", "gen", "seed", "task", "method", "device", "backend", "server", "engine")  # config parts


def settings_identity(config: dict) -> dict:
    """What decides a run's answers, flat (`gen.max_new_tokens`: 128, ...), from a composed config as a plain dict
    (a live one or meta.json's): the model, generation settings, seed, question source, the method's knobs (its
    sizing under one name), the device asked for, and a server run's server. Not the question limit (a run resumes
    with more questions), nor how it is timed (repeats, warm-up)."""
    parts = {"model": config.get("model"), "gen": config.get("gen"), "seed": config.get("seed"),
             "source": (config.get("task") or {}).get("source"), "method": method_identity(config.get("method") or {}),
             "device": config.get("device"), "backend": config.get("backend", "engine")}
    if config.get("server"):
        parts["server"] = config["server"]
    if compile_choice(config)[0]:  # compiled kernels round otherwise; auto's choice is the same run as on's or off's
        parts["engine"] = {**config["engine"], "compile": "on"}
    return flatten(parts)


def flatten(values: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def settings_hash(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:6]


def settings_label(config: DictConfig | dict) -> str:
    """The part of the default out_dir after the task: `128tok-3fa9c1`, sampled runs `128tok-t0.7-s1-3fa9c1` (the
    token budget, the temperature and seed when sampling, a hash of every setting that decides the answers)."""
    if isinstance(config, DictConfig):
        config = plain_parts(config)
    gen = config.get("gen") or {}
    words = [f"{gen.get('max_new_tokens')}tok"]
    if float(gen.get("temperature") or 0.0) > 0:
        words += [f"t{gen['temperature']:g}", f"s{config.get('seed')}"]
    return "-".join([*words, settings_hash(settings_identity(config))])


def plain_parts(config: DictConfig) -> dict:
    """The parts of a composed config that settings_identity reads, resolved (not out_dir, which names the folder
    by them)."""
    return {key: OmegaConf.to_container(config[key], resolve=True) if OmegaConf.is_config(config[key]) else config[key]
            for key in IDENTITY_KEYS if key in config}


def folder_settings(folder: Path) -> dict | None:
    """The settings identity a run folder's answers were made with: its settings.json, else (folders written before
    it) its meta.json's config; None for a folder without answers."""
    if not (folder / "answers.jsonl").exists():
        return None
    if (folder / SETTINGS_FILE).exists():
        return json.loads((folder / SETTINGS_FILE).read_text())
    if (folder / "meta.json").exists():
        return settings_identity(json.loads((folder / "meta.json").read_text()).get("config", {}))
    return None


def claim_folder(folder: Path, config: DictConfig) -> None:
    """Refuse (ConfigError, one line) a folder whose answers were made with other settings than `config`'s; else
    record `config`'s there, so the next command can be checked before it loads anything."""
    ours = settings_identity(plain_parts(config))
    theirs = folder_settings(folder)
    if theirs is not None and theirs != ours:
        differing = sorted(key for key in {*theirs, *ours} if theirs.get(key) != ours.get(key))
        there = ", ".join(f"{key}={theirs.get(key)}" for key in differing)
        here = ", ".join(f"{key}={ours.get(key)}" for key in differing)
        raise ConfigError(f"out_dir={folder} holds answers made with {there}; this command asks {here}: pass "
                          f"another out_dir=..., or leave out_dir unset to get a folder of its own for each setting")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SETTINGS_FILE).write_text(json.dumps(ours, indent=2, sort_keys=True, default=str) + "\n")
