"""cprobe's Hydra launcher plugins (Hydra instantiates launchers only from the ``hydra_plugins`` namespace)."""
