"""specbench: one draft-then-verify engine, pluggable drafters, Spec-Bench's tasks (README.md, docs/layout.md)."""
from omegaconf import OmegaConf


def method_label(name: str, budget: str | None = "upstream", batch_policy: str | None = "always") -> str:
    """A method's name in records and reports: `pld`; `pld+auto` when its budget is sized by the cost model;
    `pld+adaptive` when the batch policy sizes (or rests) speculation per step at the run's batch size."""
    label = name if budget in (None, "upstream") else f"{name}+{budget}"
    return label if batch_policy in (None, "always") else f"{label}+{batch_policy}"


def batch_suffix(batch_size) -> str:
    """What conf/config.yaml's out_dir appends to the task for batched runs: nothing at batch 1, else `-batch<B>`."""
    return "" if int(batch_size) == 1 else f"-batch{int(batch_size)}"


for _name, _resolver in (("method_label", method_label), ("batch_suffix", batch_suffix)):
    if not OmegaConf.has_resolver(_name):  # conf/config.yaml's out_dir names auto-sized and batched runs apart
        OmegaConf.register_new_resolver(_name, _resolver)
