"""specbench: one draft-then-verify engine, pluggable drafters, Spec-Bench's tasks (README.md, docs/layout.md)."""
from omegaconf import OmegaConf

from bench.blas import choose_code_path

choose_code_path()  # before anything loads MKL (bench/blas.py)

SIZINGS = ("upstream", "auto")  # method.sizing (conf/method/shared/speculation.yaml)
# method.sizing's old spellings: {their value: the sizing it means}. bench.config.fold_deprecated folds them out of a
# run's config (the one place that does); sizing_of reads them where they stay: meta.json of older runs, and the
# config Hydra names a run's folder from before the fold.
DEPRECATED_SIZING = {
    "budget": {"upstream": "upstream", "auto": "auto"},  # batch 1's name
    "batch_policy": {"always": "upstream", "adaptive": "auto"},  # gen.batch_size > 1's name
}


def sizing_of(method) -> str:
    """A method config's `method.sizing` (a DictConfig or meta.json's dict), its deprecated spellings included:
    auto when any of `sizing=auto`, `budget=auto`, `batch_policy=adaptive` is set, else upstream."""
    asked = [method.get("sizing")] + [deprecated_meaning(method, key) for key in DEPRECATED_SIZING]
    return "auto" if "auto" in asked else "upstream"


def deprecated_meaning(method, key: str) -> str | None:
    """The method.sizing that the deprecated `key` of a method config means; None when unset or not a value of it."""
    value = method.get(key)
    return DEPRECATED_SIZING[key].get(value) if isinstance(value, str) else None


def method_label(name: str, sizing: str = "upstream") -> str:
    """A method's name in records and reports: `pld`; `pld+auto` when the planner sizes its speculation (at any
    batch size)."""
    return name if sizing == "upstream" else f"{name}+{sizing}"


def label_of(method) -> str:
    """method_label of a method config (what conf/config.yaml's out_dir names the run's folder by)."""
    return method_label(method.get("name") or "unknown", sizing_of(method))


def method_identity(method: dict) -> dict:
    """A method config (plain dict) as run keys and reports tell runs apart: its sizing under one key, `budget`
    (the name run keys hashed it under before `method.sizing`, so earlier runs keep their keys), whichever
    spelling set it; a method without sizing (vanilla) as it is."""
    keys = ("sizing", *DEPRECATED_SIZING)
    identity = {key: value for key, value in method.items() if key not in keys}
    if any(key in method for key in keys):
        identity["budget"] = sizing_of(method)
    return identity


def batch_suffix(batch_size) -> str:
    """What conf/config.yaml's out_dir appends to the task for batched runs: nothing at batch 1, else `-batch<B>`."""
    return "" if int(batch_size) == 1 else f"-batch{int(batch_size)}"


for _name, _resolver in (("method_label", label_of), ("batch_suffix", batch_suffix)):
    if not OmegaConf.has_resolver(_name):  # conf/config.yaml's out_dir names auto-sized and batched runs apart
        OmegaConf.register_new_resolver(_name, _resolver)
