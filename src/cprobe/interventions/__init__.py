"""Interventions on hidden states, selected by config name (``INTERVENTIONS``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cprobe.interventions import (  # noqa: F401
    alterrep,
    autoattack,
    direction,
    fgsm,
    inlp,
    leace,
    mean_diff,
    pgd,
    rlace,
)
from cprobe.interventions.base import INTERVENTIONS, Intervention, apply, fit_intervention, needs_goal


def build_intervention(cfg: Mapping[str, Any], **context: Any) -> Intervention:
    """``INTERVENTIONS.build(cfg, **context)``: the config's keys as constructor arguments (checked)."""
    return INTERVENTIONS.build(cfg, **context)


__all__ = ["INTERVENTIONS", "Intervention", "apply", "build_intervention", "fit_intervention", "needs_goal"]
