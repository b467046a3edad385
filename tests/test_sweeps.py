"""conf/hydra/launcher/*.yaml: configs for hydra-joblib-launcher and hydra-submitit-launcher (`pip install -e
".[sweeps]"`)."""
from __future__ import annotations

import dataclasses
import importlib

import pytest

from bench.config import compose_config

# The fields of the plugins' config dataclasses in their released version 1.2.0 (checked against the installed
# plugins when they are importable, below).
JOBLIB = ("hydra_plugins.hydra_joblib_launcher.config", "JobLibLauncherConf",
          "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
          {"_target_", "n_jobs", "backend", "prefer", "require", "verbose", "timeout", "pre_dispatch", "batch_size",
           "temp_folder", "max_nbytes", "mmap_mode"})
SLURM = ("hydra_plugins.hydra_submitit_launcher.config", "SlurmQueueConf",
         "hydra_plugins.specbench_sweeps.slurm_launcher.SlurmLauncher",  # runs the plugin's, with a summary
         {"_target_", "submitit_folder", "timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb",
          "nodes", "name", "stderr_to_stdout", "partition", "qos", "comment", "constraint", "exclude", "gres",
          "cpus_per_gpu", "gpus_per_task", "mem_per_gpu", "mem_per_cpu", "account", "signal_delay_s",
          "max_num_timeout", "additional_parameters", "array_parallelism", "setup"})

LOCAL = ("hydra_plugins.hydra_submitit_launcher.config", "LocalQueueConf",
         "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
         {"_target_", "submitit_folder", "timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb",
          "nodes", "name", "stderr_to_stdout"})


def launcher_config(name: str, *overrides: str):
    return compose_config(f"hydra/launcher={name}", *overrides, return_hydra_config=True).hydra.launcher


@pytest.mark.parametrize("name, plugin", [("joblib", JOBLIB), ("submitit_slurm", SLURM),
                                                 ("submitit_local", LOCAL)])
def test_launcher_config_names_the_plugin_and_only_its_fields(name, plugin):
    module, dataclass_name, target, fields = plugin
    launcher = launcher_config(name)
    assert launcher._target_ == target
    assert set(launcher) <= fields
    try:
        schema = getattr(importlib.import_module(module), dataclass_name)
    except ImportError:
        return
    assert set(launcher) <= {f.name for f in dataclasses.fields(schema)}


def test_launcher_settings_are_overridable_from_the_command_line():
    assert launcher_config("joblib", "hydra.launcher.n_jobs=4").n_jobs == 4
    slurm = launcher_config("submitit_slurm", "hydra.launcher.partition=gpu", "hydra.launcher.constraint=a100")
    assert (slurm.partition, slurm.constraint) == ("gpu", "a100")


def test_slurm_jobs_default_to_the_local_cluster_and_run_as_many_threads_as_the_cores_they_hold():
    from omegaconf import OmegaConf

    slurm = launcher_config("submitit_slurm", "hydra.launcher.cpus_per_task=3")
    assert (slurm.partition, slurm.gpus_per_node, slurm.cpus_per_task) == (None, None, 3)
    assert OmegaConf.to_container(slurm.setup, resolve=True) == ["export OMP_NUM_THREADS=3 MKL_NUM_THREADS=3"]
