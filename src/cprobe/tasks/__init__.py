"""Tasks = what a job does (config key ``task``). Each module exposes ``run(ctx) -> DataFrame`` and
``report(table, out_dir)``; modules are imported only when asked for, to keep start-up light."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from types import ModuleType
from typing import Any

from cprobe.registry import Registry

TASK_MODULES: Registry[str] = Registry("task")
for _name in ("probing", "reliability", "causalgym", "cebab", "liberty", "prompt_bias"):
    TASK_MODULES.register(_name)(f"cprobe.tasks.{_name}")


def task_module(name: str) -> ModuleType:
    return import_module(TASK_MODULES.get(name))


def run_task(name: str) -> Callable[[Any], Any]:
    return task_module(name).run
