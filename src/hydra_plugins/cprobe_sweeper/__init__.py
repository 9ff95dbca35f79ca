"""cprobe's Hydra sweeper plugin (Hydra finds sweepers only in the ``hydra_plugins`` namespace package)."""
