"""The package's floors: data flows one way, so no module imports from a floor above its own.

0 base (errors, io, config, paths, progress, registry) < 1 data < 2 models < 3 methods (probes,
interventions, directions, explainers, metrics) < 4 core pipeline pieces (activation cache, extraction, jobs, results,
records, leaderboard, report, plots) < 5 studies (tasks, causalgym, bench) < 6 the application (pipeline, outputs, cli,
callbacks, catalog and the package top, which re-exports estimators lazily). Function-level imports count too.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "cprobe"
FLOORS = {
    0: ("errors", "io", "config", "paths", "progress", "registry"),
    1: ("data",),
    2: ("models",),
    3: ("probes", "interventions", "directions", "explainers", "metrics"),
    4: ("cache", "extract", "job", "results", "plots", "records", "leaderboard", "report"),
    5: ("tasks", "causalgym", "bench"),
    6: ("pipeline", "cli", "callbacks", "catalog", "_hydra", "outputs", "__init__"),
}


def floor(module: str) -> int:
    head = module.removeprefix("cprobe").lstrip(".").split(".")[0] or "__init__"
    for level, names in FLOORS.items():
        if head in names:
            return level
    raise AssertionError(f"module {module} has no floor: add its package to FLOORS")


@lru_cache(maxsize=1)
def modules() -> dict[str, set[str]]:
    out = {}
    for f in SRC.rglob("*.py"):
        mod = ".".join(("cprobe", *f.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
        deps = set()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cprobe":
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.split(".")[0] == "cprobe"}
        out[mod] = deps
    return out


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_import_from_a_higher_floor(module):
    deps = modules()[module]
    if module == "cprobe":
        return  # the package top re-exports from every floor, lazily
    up = sorted(d for d in deps if floor(d) > floor(module))
    assert not up, f"{module} (floor {floor(module)}) imports from higher floors: {up}"


def test_the_floor_map_catches_an_upward_import():
    assert floor("cprobe.data.grammar") < floor("cprobe.models.tiny") < floor("cprobe.tasks.reliability")
    assert floor("cprobe") == 6 and floor("cprobe.io") == 0
