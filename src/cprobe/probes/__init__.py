"""Probes over hidden states, selected by config name (``PROBES``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from cprobe.errors import ConfigError
from cprobe.probes import linear, mlp  # noqa: F401  (registers "linear" and "mlp")
from cprobe.probes.base import PROBES, Probe


def build_probe(cfg: Mapping[str, Any]) -> Probe:
    """Instantiate ``PROBES[cfg["name"]]`` with the remaining keys as constructor kwargs."""
    if "name" not in cfg:
        raise ConfigError(f"probe config needs a 'name'; choose from {PROBES.names()}")
    kwargs = {key: value for key, value in cfg.items() if key != "name"}
    cls = PROBES.get(cfg["name"])
    valid = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} for probe {cfg['name']!r}; valid keys: {valid}")
    for key, value in kwargs.items():  # YAML lists become tuples (grid axes)
        if isinstance(value, list):
            kwargs[key] = tuple(value)
    return cls(**kwargs)


__all__ = ["PROBES", "Probe", "build_probe"]
