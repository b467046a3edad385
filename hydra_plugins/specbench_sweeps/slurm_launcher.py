"""hydra/launcher=submitit_slurm's launcher: hydra-submitit-launcher's SlurmLauncher, which it runs, except that the
sweep waits for every job and ends with a summary (bench.measure.sweep_launcher). It imports the plugin only when
used, so Hydra's scan of hydra_plugins stays quiet where the sweeps extra is not installed."""
from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher

REQUIRES = "hydra_plugins.hydra_submitit_launcher"  # the plugin it runs (bench.config.missing_launcher checks it)


class SlurmLauncher(Launcher):
    def __init__(self, **params) -> None:
        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as PluginSlurmLauncher

        self.plugin = PluginSlurmLauncher(**params)  # each job runs it (its __call__ and checkpoint)

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.plugin.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from bench.measure.sweep_launcher import launch_every_job

        return launch_every_job(self.plugin, job_overrides, initial_job_idx)
