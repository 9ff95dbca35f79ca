"""MIB's causal variable track (Mueller et al. 2025, "MIB: A Mechanistic Interpretability Benchmark") as a study:
does a method's featurizer at a site hold a causal variable of the task's high-level model? Interchange
intervention accuracy (IIA) per task × variable × counterfactual kind × layer × token position × method, MIB's two
aggregates, and the controls beside every cell (docs/mib.md).

Steps, per task (:mod:`cprobe.data.mib`: MIB's tasks built offline, seeded):

1. train and test pairs of every counterfactual kind; the model's greedy output on every prompt, checked by the
   task's MIB checker; a model whose accuracy on the test bases is below ``mib.min_accuracy`` is reported (kind
   ``accuracy``, ``scored`` false), not scored; otherwise MIB's filter keeps the pairs whose base and source it gets
   right;
2. per variable, every method's featurizer at every site (layer × position), by its declared capabilities
   (:mod:`cprobe.tasks.mib_engine`): the whole vector (``whole_vector``), DAS trained through the model (``causal``,
   its ``k``), DBM's mask over a basis (``feature_mask``), any other direction method or direction-exposing
   intervention fitted on the prompts' states labelled by the variable's value (a subspace of its pairwise
   directions);
3. every featurizer's interchange on every kept test pair (the base's features from the source's), the greedy output
   checked against the causal model's counterfactual output — the controls too: the identity featurizer (the whole
   vector) at the same site, a random rotation of the same dimension, and the same method fitted and scored on the
   untrained model of the same architecture (no filter: it gets nothing right);
4. per cell its IIA, n and a percentile bootstrap interval over the test pairs (resampled within each kind, one draw
   for every site, so the aggregates resample consistently); MIB's aggregates (``aggregate_results.py``): IIA per
   (layer, position) as the mean over the counterfactual kinds, per layer the best position, then ``mib_best`` the
   best layer and ``mib_mean`` the mean over layers.

The long table (column ``kind``): ``accuracy`` (per task), ``cell`` (per site and kind, ``counterfactual`` ``all``
for the mean over kinds), ``summary`` (``mib_best``, ``mib_mean``, with the layer and position they came from);
``control``: ``none`` (the method), ``identity``, ``rotation``, ``untrained``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cprobe.errors import ConfigError
from cprobe.job import JobContext
from cprobe.methods import Needs, check, declares, draw_seed, is_intervention, provenance
from cprobe.records import Derived, RecordSpec
from cprobe.tasks import Uses

log = logging.getLogger("cprobe")

USES = Uses(groups=("model", "layers"), methods="mib.methods")
METHODS = ("das", "dbm", "vanilla")
CONTROLS = ("identity", "rotation", "untrained")
DEFAULT_DAS = {"lr": 0.01, "batch_size": 32, "epochs": 3, "k": 16}  # k: MIB's n_features for answer_pointer
DEFAULT_DBM = {"basis": "standard", "lr": 0.01, "batch_size": 32, "epochs": 3, "sparsity": 1e-4,
               "temperature": [1.0, 0.01]}


@dataclass(frozen=True)
class Config:
    """The ``mib:`` node."""

    tasks: list[str] = field(default_factory=lambda: ["mcqa", "arithmetic", "ioi", "ravel"])
    variables: dict = field(default_factory=dict)  # {task: [variables]} (a task left out: all of its variables)
    counterfactuals: dict = field(default_factory=dict)  # {task: [kinds]}
    positions: dict = field(default_factory=dict)  # {task: [MIB token position ids]}
    files: dict = field(default_factory=dict)  # {task: file settings} (relative paths: under the data dir)
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    n_train: int = 64  # pairs per counterfactual kind that fit the methods (before the filter)
    n_test: int = 64  # pairs per counterfactual kind scored (before the filter)
    das: dict = field(default_factory=lambda: dict(DEFAULT_DAS))
    dbm: dict = field(default_factory=lambda: dict(DEFAULT_DBM))
    interventions: dict = field(default_factory=dict)  # {name: settings} of direction-exposing interventions
    max_directions: int = 8  # a state-fitted method: directions between consecutive values of the most frequent
    min_accuracy: float = 0.8  # a model below it on a task is reported, not scored
    filter: str = "both"  # MIB's filter: pairs whose base and source the model gets right (base: the base; none)
    controls: list[str] = field(default_factory=lambda: list(CONTROLS))
    n_boot: int = 1000
    pair_seed: int = 0  # the pairs (+ the job seed)
    export: bool = True  # every method's fits as an MIB submission folder in the run dir (mib_submission/<method>)

    def __post_init__(self) -> None:
        from cprobe.data.mib import check_names

        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"mib.tasks must name each task once, got {list(self.tasks)}")
        for t in {*self.tasks, *self.variables, *self.counterfactuals, *self.positions, *self.files}:
            check_names(t, self.variables.get(t, ()), self.counterfactuals.get(t, ()), self.positions.get(t, ()))
        check(self.methods, "mib.methods", Needs(direction=True, whole_vector=True, feature_mask=True))
        bad = sorted(set(self.controls) - set(CONTROLS))
        if bad:
            raise ValueError(f"unknown control(s) {bad} in mib.controls; choose from {list(CONTROLS)}")
        if self.n_train < 1 or self.n_test < 1 or self.max_directions < 1 or self.n_boot < 1:
            raise ValueError("mib.n_train, mib.n_test, mib.max_directions and mib.n_boot must be >= 1")
        from cprobe.tasks.mib_engine import FILTERS

        if self.filter not in FILTERS:
            raise ValueError(f"unknown mib.filter {self.filter!r}; choose from {list(FILTERS)}")
        if not 0 <= self.min_accuracy <= 1:
            raise ValueError(f"mib.min_accuracy must be in [0, 1], got {self.min_accuracy}")
        for key, known in (("das", DEFAULT_DAS), ("dbm", DEFAULT_DBM)):
            unknown = sorted(set(getattr(self, key)) - set(known))
            if unknown:
                raise ValueError(f"unknown key(s) {unknown} under mib.{key}; known: {sorted(known)}")

    def params(self, name: str) -> dict[str, Any]:
        """A method's settings by its capabilities: the masked one's ``dbm``, the causal one's ``das``, an
        intervention's ``interventions.<name>``."""
        if is_intervention(name):
            return dict(self.interventions.get(name) or {})
        if declares(name, "feature_mask"):
            return {**DEFAULT_DBM, **self.dbm}
        if declares(name, "causal"):
            return {**DEFAULT_DAS, **self.das}
        return {"lam": 1.0} if declares(name, "per_model_lambda") else {}


def validate(job: Any) -> None:
    from cprobe.data.mib import build_task, task_files
    from cprobe.errors import DataError
    from cprobe.methods import build
    from cprobe.models.load import parse_model_config

    cfg: Config = job.task_cfg
    mc = parse_model_config(job.keys.model or {})
    if mc.source in ("zoo", "fact_world"):
        raise ConfigError(f"model {mc.name!r} is a model set; the mib task reads one causal LM")
    if mc.kind not in ("causal", "auto"):
        raise ConfigError(f"the mib task reads a causal LM's generated output; model {mc.name!r} is {mc.kind!r}")
    for m in cfg.methods:
        try:
            build(m, cfg.params(m), seed=0)
        except (ConfigError, ValueError, TypeError) as e:
            raise ConfigError(f"bad settings for mib method {m!r}: {e}") from None
    if job.data_root is not None:
        for t in cfg.tasks:
            try:
                build_task(t, task_files(t, cfg.files.get(t, {}), job.data_root))
            except DataError as e:
                raise ConfigError(str(e)) from None


# ----------------------------------------------------------------------------------------------- the job
def _fits(adapter: Any, P: Any, config: Config, sites: Sequence[Any], seed: int, device: Any) -> dict[str, list]:
    """Every method's fits per variable (declared capabilities decide how each is fitted)."""
    from cprobe.tasks.mib_engine import fit_states, fit_through

    out = {}
    for v in config.variables.get(P.task.key, P.task.variables):
        fits = []
        for m in config.methods:
            if declares(m, "causal") and not is_intervention(m):
                fits += fit_through(adapter, P, v, m, config.params(m), sites, seed)
            else:
                fits += fit_states(P, v, m, config.params(m), sites, seed, config.max_directions, device)
        out[v] = fits
    if not P.train and any(not declares(m, "whole_vector") for m in config.methods):
        log.warning("MIB task %s: no train pair left after the filter; only the whole vector is scored (raise "
                    "mib.n_train)", P.task.key)
    return out


def _controls(fits: Mapping[str, list], config: Config, d: int, seed: int) -> dict[str, dict[str, list]]:
    """The identity featurizer at each fit's site and a random rotation of its dimension, per variable."""
    from cprobe.tasks.mib_engine import Fit, rotation

    out: dict[str, dict[str, list]] = {"none": dict(fits)}
    if "identity" in config.controls:
        out["identity"] = {v: [Fit(f.method, f.family, f.site, None) for f in fs] for v, fs in fits.items()}
    if "rotation" in config.controls:
        out["rotation"] = {v: [rotation(f, d, draw_seed(seed, i)) for i, f in enumerate(fs)] for v, fs in fits.items()}
    return out


def _task_rows(ctx: JobContext, adapter: Any, task: Any, config: Config, layers: Sequence[int], seed: int
               ) -> list[dict[str, Any]]:
    """One task's accuracy row, and its cells and summaries where the model can do it."""
    from cprobe.models.sites import Site
    from cprobe.tasks.mib_engine import prompts, score

    sites = [Site(l, task.position(p)) for p in config.positions.get(task.key, task.positions) for l in layers]
    kinds = config.counterfactuals.get(task.key, task.kinds)
    P = prompts(adapter, task, kinds, sites, config.n_train, config.n_test, seed, ctx.progress, filter=config.filter)
    scored = P.accuracy >= config.min_accuracy
    acc = {"kind": "accuracy", "dataset": task.key, "mib_task": task.mib_id, "metric": "task_accuracy",
           "value": P.accuracy, "n": int(sum(P.candidates.values())), "scored": scored, "n_kept": len(P.test)}
    log.info("%s on MIB %s: accuracy %.3f on %d test bases; %d of them kept", adapter.name, task.key, P.accuracy,
             acc["n"], len(P.test))
    if not scored:
        ctx.warn(f"{adapter.name} gets {P.accuracy:.2f} of MIB task {task.key} right, below mib.min_accuracy="
                 f"{config.min_accuracy}: reported, not scored")
        return [acc]
    if not P.test:
        ctx.warn(f"MIB task {task.key}: no test pair left after the filter")
        return [acc]
    t0 = time.perf_counter()
    fits = _fits(adapter, P, config, sites, seed, ctx.device)
    ctx.timings[f"fit_{task.key}_s"] = time.perf_counter() - t0
    if config.export:
        _export(ctx.out_dir / "mib_submission", adapter, task, fits)
    runs = _controls(fits, config, adapter.hidden_size, seed)
    t0 = time.perf_counter()
    results = {c: score(adapter, P, f, sites, ctx.progress) for c, f in runs.items()}
    if "untrained" in config.controls:
        from cprobe.models.load import untrained

        raw = untrained(adapter, seed)
        Q = prompts(raw, task, kinds, sites, 0, 0, seed, ctx.progress, keep=P)
        runs["untrained"] = _fits(raw, Q, config, sites, seed, ctx.device)
        results["untrained"] = score(raw, Q, runs["untrained"], sites, ctx.progress)
    ctx.timings[f"score_{task.key}_s"] = time.perf_counter() - t0
    return [acc, *_summaries(P, runs, results, sites, config, seed)]


def _export(root: Path, adapter: Any, task: Any, fits: Mapping[str, list]) -> None:
    """Each method's fits as an MIB submission folder ``root/<method>`` (:mod:`cprobe.mib_format`)."""
    from cprobe.mib_format import Unit, export, write_manifest

    pos_ids = {task.position(p): p for p in task.positions}
    model_class = type(adapter.model).__name__
    for method in dict.fromkeys(f.method for fs in fits.values() for f in fs):
        entries = []
        for variable, fs in fits.items():
            units = [Unit(f.site.layer, pos_ids[f.site.position], f.base or f.featurizer, f.indices) for f in fs
                     if f.method == method]
            folder = export(root / method, task.mib_id, model_class, variable, units, adapter.n_layers)
            entries.append({"folder": folder.name, "task": task.mib_id, "model": adapter.name,
                            "model_class": model_class, "variable": variable,
                            "positions": sorted({u.position for u in units}),
                            "layers": sorted({u.layer for u in units if u.layer < adapter.n_layers})})
        write_manifest(root / method, entries)


def _summaries(P: Any, runs: Mapping[str, Mapping[str, list]], results: Mapping[str, Mapping[str, Any]],
               sites: Sequence[Any], config: Config, seed: int) -> list[dict[str, Any]]:
    """The cell and summary rows of every (control, variable, method)."""
    from cprobe.tasks.mib_aggregate import method_rows

    pos_ids = {P.task.position(p): p for p in P.task.positions}
    kinds = np.array([p.kind for p in P.test])
    rows = []
    for control, by_var in runs.items():
        for variable, fits in by_var.items():
            res = results[control].get(variable)
            if res is None:
                continue
            for method in dict.fromkeys(f.method for f in fits):
                idx = [i for i, f in enumerate(fits) if f.method == method]
                rows += method_rows(P.task.key, variable, method, fits[idx[0]].family, control,
                                    [fits[i] for i in idx], idx, res, kinds, pos_ids, config.n_boot, seed)
    return rows


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    from cprobe.data.mib import build_task, task_files
    from cprobe.extract import resolve_layers

    adapter = ctx.adapter(dict(ctx.cfg["model"]))
    if adapter.kind != "causal":
        raise ConfigError(f"the mib task reads a causal LM's generated output; model {adapter.name!r} is "
                          f"{adapter.kind!r}")
    layers = resolve_layers(ctx.cfg["layers"], adapter.n_layers)
    seed = config.pair_seed + ctx.seed
    rows = []
    for t in config.tasks:
        task = build_task(t, task_files(t, config.files.get(t, {}), ctx.data_root))
        for note in task.notes:
            ctx.warn(f"MIB task {t}: {note}")
        rows += _task_rows(ctx, adapter, task, config, layers, seed)
    table = pd.DataFrame(rows)
    table["model"] = adapter.name
    for col, fill in (("variable", ""), ("counterfactual", ""), ("layer", -1), ("position", ""), ("method", ""),
                      ("family", ""), ("control", ""), ("k", -1)):
        table[col] = table[col].fillna(fill) if col in table else fill
    table["layer"], table["k"] = table["layer"].astype(int), table["k"].astype(int)
    sources = {m: provenance(m) for m in config.methods}
    table["method_source"] = [sources.get(m, "") for m in table["method"]]
    return table


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """``mib_results.md``: per task, variable and method, MIB's two aggregates with the controls beside them."""
    from cprobe.io import atomic_write_bytes
    from cprobe.tasks.mib_aggregate import results_markdown

    atomic_write_bytes(out_dir / "mib_results.md", results_markdown(table).encode())


RECORDS = RecordSpec(
    dataset="dataset", model="model", layer=Derived(lambda t: t["layer"].where(t["layer"] >= 0)),
    read_layer=Derived(lambda t: t["layer"].where(t["layer"] >= 0)), position="position", method="method",
    family="family", slice=("kind", "variable", "counterfactual", "control"),
    slice_defaults={"kind": "summary", "counterfactual": "all", "control": "none"}, metric="metric", value="value",
    n="n", breakdowns=("kind", "counterfactual", "control"))
"""Per task (the record's dataset) × variable × method: MIB's aggregates (the leaderboard's cells), every site's IIA
per kind and over kinds (``kind: cell``) and the controls (``control``), the model's accuracy per task."""
