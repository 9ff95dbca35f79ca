"""Probes over hidden states, selected by config name (``PROBES``; build with ``PROBES.build(cfg, seed=, device=)``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cprobe.probes import linear, mlp  # noqa: F401  (registers "linear" and "mlp")
from cprobe.probes.base import PROBES, Probe


def build_probe(cfg: Mapping[str, Any], **context: Any) -> Probe:
    """``PROBES.build(cfg, **context)``: the config's keys as constructor arguments (checked)."""
    return PROBES.build(cfg, **context)


__all__ = ["PROBES", "Probe", "build_probe"]
