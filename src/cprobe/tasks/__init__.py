"""Tasks = what a job does (config key ``task``). Each module exposes a ``Config`` dataclass (its node), ``USES``
(what it reads of the rest of the config), ``run(ctx, config) -> DataFrame | TaskResult`` and ``report(table, out_dir)``; modules
are imported only when asked for, to keep start-up light."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import import_module
from types import ModuleType
from typing import Any

from cprobe.registry import Registry

TASK_MODULES: Registry[str] = Registry("task")
for _name in ("probing", "reliability", "causalgym", "cebab", "liberty", "prompt_bias", "ravel", "axbench", "mib"):
    TASK_MODULES.register(_name)(f"cprobe.tasks.{_name}")

SHARED_GROUPS = ("model", "dataset", "split", "probe", "intervention", "layers", "position")
"""The config groups and top-level keys a task may or may not read. Everything else at the top (``seed``,
``device``, ``compute``, ``paths``, ``cache``, ``progress``, ``force``, ``name``) is every job's."""

CAPABILITIES = {"model_sets": "reads a model set (a zoo of models, or models it trains on a fact world's corpus)"}
"""What a task may declare it can do beyond reading one model."""


@dataclass(frozen=True)
class TaskResult:
    """What a task's ``run`` returns when its records have per-item values: its table and ``items``, the per-item
    values its records' ``items`` hook (:class:`cprobe.records.RecordSpec`) turns into ``record_items.parquet`` — in
    memory, never read back from a file. A task without per-item values returns just its table."""

    table: Any
    items: Any = None


def task_result(out: Any) -> TaskResult:
    """A task's ``run`` output as a :class:`TaskResult` (a bare table has no per-item values)."""
    return out if isinstance(out, TaskResult) else TaskResult(out)


@dataclass(frozen=True)
class Uses:
    """What a task reads besides its own node: the shared config groups / top-level keys (``SHARED_GROUPS``) and its
    capabilities (``CAPABILITIES``). :func:`cprobe.pipeline.prepare` validates only what a task uses and refuses a
    command-line setting of a group it does not use. ``methods`` is where the task names the methods it scores,
    which the top-level ``method=NAME`` sets (:func:`cprobe.pipeline.choose_method`): ``"intervention"`` (the
    group: one method per job) or the dotted key of a list (``"causalgym.methods"``); None: it takes no ``method``."""

    groups: frozenset[str]
    capabilities: frozenset[str] = frozenset()
    methods: str | None = None

    def __init__(self, groups: Iterable[str], capabilities: Iterable[str] = (), methods: str | None = None) -> None:
        object.__setattr__(self, "groups", frozenset(groups))
        object.__setattr__(self, "capabilities", frozenset(capabilities))
        object.__setattr__(self, "methods", methods)
        bad = sorted(self.groups - set(SHARED_GROUPS))
        if bad:
            raise ValueError(f"unknown config group(s) {bad}; choose from {list(SHARED_GROUPS)}")
        bad = sorted(self.capabilities - set(CAPABILITIES))
        if bad:
            raise ValueError(f"unknown task capability {bad}; choose from {sorted(CAPABILITIES)}")


def task_module(name: str) -> ModuleType:
    return import_module(TASK_MODULES.get(name))


def task_uses(name: str) -> Uses:
    """The task's declaration (every task module has one; a missing one is a bug)."""
    uses = getattr(task_module(name), "USES", None)
    if not isinstance(uses, Uses):
        raise TypeError(f"task module {TASK_MODULES.get(name)} declares no USES = Uses(...)")
    return uses


def tasks_with(capability: str) -> list[str]:
    """The tasks declaring ``capability``."""
    return [t for t in TASK_MODULES.names() if capability in task_uses(t).capabilities]


