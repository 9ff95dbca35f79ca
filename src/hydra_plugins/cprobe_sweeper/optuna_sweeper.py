"""``hydra/sweeper=cprobe_optuna``: a hyperparameter search on optuna's ask/tell API (:mod:`cprobe.search`).

Hydra imports every module under ``hydra_plugins`` on each start, so this one imports nothing heavy: optuna and
cprobe's search code load only when a search runs."""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper


class CprobeOptunaSweeper(Sweeper):
    def __init__(self, **options: Any) -> None:
        self.options = options  # validated in cprobe.search.prepare (from the composed config, with the job's)
        self.hydra_context: Any = None
        self.config: Any = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        from cprobe.search import run

        return run(self, arguments)
