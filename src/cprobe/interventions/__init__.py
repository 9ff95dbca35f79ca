"""Interventions on hidden states, selected by config name (``INTERVENTIONS``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from cprobe.errors import ConfigError
from cprobe.interventions import (  # noqa: F401
    alterrep,
    autoattack,
    fgsm,
    inlp,
    leace,
    mean_diff,
    pgd,
    rlace,
)
from cprobe.interventions.base import INTERVENTIONS, Intervention


def build_intervention(cfg: Mapping[str, Any]) -> Intervention:
    """``INTERVENTIONS[cfg["name"]]`` with the remaining keys as constructor kwargs (checked)."""
    if "name" not in cfg:
        raise ConfigError(f"intervention config needs a 'name'; choose from {INTERVENTIONS.names()}")
    cls = INTERVENTIONS.get(cfg["name"])
    kwargs = {k: v for k, v in cfg.items() if k != "name"}
    params = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} for intervention {cfg['name']!r}; valid: {sorted(params)}")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"intervention {cfg['name']!r}: {e}") from None


__all__ = ["INTERVENTIONS", "Intervention", "build_intervention"]
