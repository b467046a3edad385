"""specbench: one draft-then-verify engine, pluggable drafters, Spec-Bench's tasks (README)."""
from omegaconf import OmegaConf


def method_label(name: str, budget: str | None = "upstream") -> str:
    """A method's name in records and reports: `pld`, or `pld+auto` when its budget is sized by the cost model."""
    return name if budget in (None, "upstream") else f"{name}+{budget}"


if not OmegaConf.has_resolver("method_label"):  # conf/config.yaml's out_dir names auto-sized runs apart
    OmegaConf.register_new_resolver("method_label", method_label)
