"""The package's floors: data flows one way, so no module imports from a floor above its own.

0 base (errors, io, config, paths, ownership: what cprobe may delete, progress, registry, estimator, stats: the shared
linear statistics, the cache store and its kinds, compute: the hardware) < 1 data < 2 models < 3 methods (probes,
interventions, directions, explainers, metrics, sae) < 4 core pipeline pieces (the method vocabulary, extraction, jobs,
a sweep read back, the SLURM commands, results, records, leaderboard, report, plots, experiment trackers) < 5 studies (tasks, bench) < 6 the
application's pieces (pipeline, outputs, callbacks, catalog, what each launcher reads, running under Hydra,
the plugin surface) < 7 the entry points (cli, the Python API, the hyperparameter search, the SLURM
launcher, the package top, which re-exports estimators lazily).

Each module has a floor: its own entry in ``FLOORS`` (a top-level module) or its folder's (every module of a package
sits on the package's floor). Arrows are checked module to module. Function-level and ``TYPE_CHECKING`` imports count
too, and no two modules may import each other, directly or round a longer loop (an import circle), even on one floor.
Nor may two entries of ``FLOORS`` reach each other (some module of one imports some module of the other, both ways):
that is a folder holding two floors (a reader below a module of another entry that the folder's driver stands on),
caught even when both entries share a floor.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "cprobe"
FLOORS = {
    0: ("errors", "io", "config", "paths", "ownership", "progress", "registry", "estimator", "cache", "compute",
        "stats"),
    1: ("data",),
    2: ("models",),
    3: ("probes", "interventions", "directions", "explainers", "metrics", "sae"),
    4: ("extract", "job", "sweep", "slurmctl", "results", "plots", "records", "leaderboard", "report", "trackers",
        "testing", "yardsticks", "methods", "mib_format"),
    5: ("tasks", "bench"),
    6: ("pipeline", "callbacks", "catalog", "_hydra", "outputs", "launchers", "plugin"),
    7: ("cli", "api", "search", "launch", "__init__"),
}


def entry(module: str) -> str:
    """The ``FLOORS`` entry ``module`` belongs to: its top-level module or package."""
    return module.removeprefix("cprobe").lstrip(".").split(".")[0] or "__init__"


def floor(module: str) -> int:
    for level, names in FLOORS.items():
        if entry(module) in names:
            return level
    raise AssertionError(f"module {module} has no floor: add it (or its package) to FLOORS")


@lru_cache(maxsize=1)
def files() -> dict[str, Path]:
    """Module name -> source file (a package is its ``__init__``)."""
    return {".".join(("cprobe", *f.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__"): f
            for f in SRC.rglob("*.py")}


def imports(module: str, source: str) -> set[str]:
    """The cprobe modules ``source`` (the text of ``module``) imports, wherever the import statement stands.
    ``from cprobe.x import y`` depends on the module ``cprobe.x.y`` when that is a module, else on ``cprobe.x``."""
    known = files()
    package = module if known.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .x import y
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "cprobe":
                continue
            deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.split(".")[0] == "cprobe"}
    return deps - {module}


@lru_cache(maxsize=1)
def modules() -> dict[str, set[str]]:
    return {mod: imports(mod, f.read_text(encoding="utf-8")) for mod, f in files().items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module -> modules it imports): its strongly connected components of more
    than one module (Tarjan), each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circles():
    assert circles(modules()) == [], "modules that import each other (break the loop: move the shared piece down)"


def test_the_circle_finder_finds_direct_and_longer_loops():
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c", "f"}, "f": set(), "g": {"g"}}
    assert circles(graph) == [["a", "b"], ["c", "d", "e"]]
    # TYPE_CHECKING and function-level imports are imports too
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cprobe.models.adapter import X\n" \
          "def f():\n    from cprobe.pipeline import collect\n"
    assert imports("cprobe.callbacks", src) == {"cprobe.models.adapter", "cprobe.pipeline"}


def entry_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` (module -> modules it imports) seen entry to entry: an arrow where any module of one imports any
    module of the other."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        out.setdefault(entry(mod), set()).update(entry(d) for d in deps if entry(d) != entry(mod))
    return out


def test_every_module_has_one_floor_and_every_entry_is_a_module():
    names = [n for ns in FLOORS.values() for n in ns]
    assert len(names) == len(set(names)), "an entry on two floors"
    assert {entry(m) for m in files()} == set(names), "FLOORS names a module that is gone, or misses one"


def test_no_folder_holds_two_floors():
    graph = entry_graph(modules())
    graph.pop("__init__")  # the package top re-exports from every floor, lazily
    assert circles(graph) == [], "entries that reach each other: move the lower module of the folder down"


def test_the_entry_check_catches_a_reader_beside_its_driver():
    # the layout before issue 45: callbacks read launch/sweep.py, while launch/slurm.py stands on callbacks
    graph = {"cprobe.callbacks": {"cprobe.launch.sweep"}, "cprobe.launch.slurm": {"cprobe.callbacks"},
             "cprobe.launch.sweep": set()}
    assert circles(graph) == []  # no module circle ...
    assert circles(entry_graph(graph)) == [["callbacks", "launch"]]  # ... but one folder on two floors
    assert floor("cprobe.callbacks") < floor("cprobe.launch.slurm")  # and the reader's import runs upward


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_import_from_a_higher_floor(module):
    deps = modules()[module]
    if module == "cprobe":
        return  # the package top re-exports from every floor, lazily
    up = sorted(d for d in deps if floor(d) > floor(module))
    assert not up, f"{module} (floor {floor(module)}) imports from higher floors: {up}"


def test_the_floor_map_catches_an_upward_import():
    assert floor("cprobe.data.grammar") < floor("cprobe.models.tiny") < floor("cprobe.tasks.reliability")
    assert floor("cprobe") == 7 and floor("cprobe.io") == 0
    assert floor("cprobe.sweep") < floor("cprobe.callbacks") < floor("cprobe.launch.slurm")


def test_no_function_under_tasks_is_longer_than_100_lines():
    """The studies plan and score; the engine fits and edits (issue 45): no function (or method) under ``tasks/``
    runs past 100 lines, decorators and docstring included."""
    long = []
    for f in sorted((SRC / "tasks").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - start + 1 > 100:
                    long.append(f"{f.relative_to(SRC)}::{node.name} ({node.end_lineno - start + 1} lines)")
    assert not long, long
