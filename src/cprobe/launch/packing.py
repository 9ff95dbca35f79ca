"""Several sweep points per array task: one task's imports, model load and extraction serve all its points.

Points are ordered by what their activations depend on (the overrides of the model, dataset, position, compute,
cache and the presets; :data:`SHARED_KEYS`), then cut into tasks of consecutive points, so the points that share a
model and its activations land in the same task, where the model is loaded once (:meth:`cprobe.job.JobContext.adapter`
keeps it between jobs) and the states are extracted once (the cache). ``points_per_task=auto`` spreads the sweep over
as many tasks as the partition runs at once: one wave, each task's start-up paid once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cprobe.errors import ConfigError

SHARED_KEYS = ("model", "dataset", "position", "compute", "device", "cache", "paths", "experiment", "debug", "task",
               "split")
"""Override heads whose values change the model or its activations: points that differ in them go apart."""


def _head(override: str) -> str:
    key = override.split("=", 1)[0].lstrip("+~")
    return key.split(".")[0].split("/")[0]


def group_key(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides of a point that decide its model and activations (sorted)."""
    return tuple(sorted(o for o in overrides if _head(o) in SHARED_KEYS))


def per_task(setting: Any, n_points: int, slots: int) -> int:
    """Points per array task: an int, or ``auto`` = the points spread over ``slots`` tasks running at once."""
    if setting is None or str(setting).strip().lower() == "auto":
        return max(1, math.ceil(n_points / max(1, slots)))
    try:
        k = int(setting)
    except (TypeError, ValueError):
        raise ConfigError(f"hydra.launcher.points_per_task={setting!r} must be a positive integer or auto") from None
    if k < 1:
        raise ConfigError(f"hydra.launcher.points_per_task={setting!r} must be >= 1 (or auto)")
    return k


def pack(keys: Sequence[tuple[str, ...]], k: int) -> list[list[int]]:
    """Indices of the points, in tasks of at most ``k``: grouped by key (first appearance order), then cut into
    ``ceil(n / k)`` tasks of near-equal size."""
    n = len(keys)
    if n == 0:
        return []
    first: dict[tuple[str, ...], int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    order = sorted(range(n), key=lambda i: (first[keys[i]], i))
    tasks = math.ceil(n / max(1, k))
    size, extra = divmod(n, tasks)
    out, start = [], 0
    for t in range(tasks):
        end = start + size + (1 if t < extra else 0)
        out.append(order[start:end])
        start = end
    return out
