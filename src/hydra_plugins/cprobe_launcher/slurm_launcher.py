"""``hydra/launcher=slurm``: cprobe's SLURM launcher. Hydra imports this module whenever it scans its plugins, so it
imports nothing heavy; the logic is :mod:`cprobe.launch.slurm` (docs/cluster.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.plugins.launcher import Launcher


class SlurmLauncher(Launcher):
    """Packs sweep points into SLURM array tasks through submitit, follows them, or detaches (``--detach``)."""

    def __init__(self, **params: Any) -> None:
        from cprobe.launch.slurm import Driver

        self.driver = Driver(params)

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.driver.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        return self.driver.launch(job_overrides, initial_job_idx)
