"""Structural probing by layer: probe accuracy for each property at each layer, with majority baselines.

One extraction (all requested layers in one pass, cached) feeds every probe × property × layer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from cprobe.metrics.baselines import majority_baseline
from cprobe.data.base import Dataset
from cprobe.data.registry import check_properties
from cprobe.data.splits import make_splits
from cprobe.compute import thread_budget
from cprobe.errors import ConfigError, DataError
from cprobe.extract import extract, resolve_layers
from cprobe.job import JobContext
from cprobe.tasks import Uses
from cprobe.probes import PROBES, Probe
import cprobe.plots as plots
from cprobe.plots import new_figure, save
from cprobe.progress import track
from cprobe.records import RecordSpec, const, job_records
from cprobe.probes.grid import PROBE_FITS, fit_cached_many

log = logging.getLogger("cprobe")

USES = Uses(groups=("model", "dataset", "split", "probe", "layers", "position"))


@dataclass(frozen=True)
class Config:
    """The ``probing:`` node."""

    properties: list[str] = field(default_factory=lambda: ["z_c", "z_e"])


def validate(job: Any) -> None:
    if not job.keys.probe:
        raise ConfigError("no probe configured; choose one with probe=linear|mlp|all")
    if job.keys.dataset is None or job.keys.split is None:
        raise ConfigError("the probing task needs dataset= and split= (e.g. split=probing)")
    fractions = job.keys.split.get("fractions", {})
    if "train" not in fractions or "test" not in fractions:
        raise ConfigError(f"the probing task needs 'train' and 'test' splits; split.fractions has {list(fractions)}")
    if not job.task_cfg.properties:
        raise ConfigError("probing.properties is empty; list the dataset properties to probe, e.g. [z_c]")
    check_properties(job.keys.dataset, job.task_cfg.properties, "probing.properties")


def property_labels(ds: Dataset, props: list[str], ctx: JobContext) -> dict[str, tuple[list[str], np.ndarray]]:
    """Label arrays of the properties that can be probed (two or more values besides "none").

    A property with a single value is skipped with a loud warning; none left is an error.
    """
    for p in props:
        if p not in ds.properties:
            raise ConfigError(f"property {p!r} not in dataset {ds.name!r}; it has {list(ds.properties)}")
    labels: dict[str, tuple[list[str], np.ndarray]] = {}
    for prop in props:
        values = ds.values(prop)
        if len(values) < 2:
            ctx.warn(f"skipping property {prop}: {ds.name} has {len(values)} value(s) other than 'none' ({values})")
            continue
        labels[prop] = (values, ds.labels(prop, values))
    if not labels:
        raise DataError(f"no property of {props} has two or more values in {ds.name!r}; nothing to probe")
    return labels


def fit_task(probe: Probe, X: Tensor, y: np.ndarray, splits: Mapping[str, np.ndarray]) -> tuple:
    """The fit of ``probe`` on the train split (selecting hyperparameters on the validation split when there is
    one; rows whose label is "none" (−1) are left out of every split), as a task of
    :func:`cprobe.probes.grid.fit_cached_many`."""
    tr, va, _ = _split_rows(y, splits)
    yt = torch.from_numpy(y)
    val = (X[va], yt[va]) if va is not None and len(va) else (None, None)
    return probe, X[tr], yt[tr], *val


def _split_rows(y: np.ndarray, splits: Mapping[str, np.ndarray]) -> tuple:
    tr, va, te = (splits[s][y[splits[s]] >= 0] if s in splits else None for s in ("train", "val", "test"))
    if len(tr) == 0 or len(te) == 0:
        raise DataError("empty train or test split after dropping 'none' labels")
    return tr, va, te


def score(probe: Probe, X: Tensor, y: np.ndarray, splits: Mapping[str, np.ndarray], source: str,
          seconds: float) -> dict[str, Any]:
    """A fitted probe's test accuracy beside the majority baseline and the split sizes (``probe_source``: "fit", or
    "cache" when the same probe config and seed saw the same activations and labels before)."""
    tr, va, te = _split_rows(y, splits)
    return {"accuracy": probe.score(X[te], torch.from_numpy(y)[te]), "majority": majority_baseline(y[tr], y[te]),
            "n_train": len(tr), "n_val": 0 if va is None else len(va), "n_test": len(te),
            "best_params": str(getattr(probe, "best_params", "")), "fit_s": seconds, "probe_source": source}


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    cfg = ctx.cfg
    adapter = ctx.adapter(cfg["model"])
    ds = ctx.dataset()
    layers = resolve_layers(cfg["layers"], adapter.n_layers)
    ex = extract(adapter, ds, layers, cfg["position"], ctx.cache, progress=ctx.progress)
    for reason, n in ex.dropped.items():
        ctx.warn(f"dropped {n} of {len(ds)} items: {reason}")
    ctx.timings["extract_s"] = ex.seconds
    task_acc = ex.task_accuracy
    log.info("%s task accuracy on %s: %s", adapter.name, ex.dataset.name,
             "n/a (no LM head)" if task_acc is None else f"{task_acc:.4f}")
    splits = make_splits(ex.dataset, cfg["split"], ctx.seed)
    labels = property_labels(ex.dataset, list(config.properties), ctx)
    probes = cfg["probe"]
    jobs = [(p, l, n) for p in labels for l in layers for n in probes]
    fit_cache = ctx.cache_dir(PROBE_FITS)
    rows, t0 = [], time.perf_counter()
    # the fits on the job's cores, a worker process each when they are many (bitwise the same probes either way)
    tasks = [fit_task(ctx.probe(probes[pname]), ex.acts[layer], labels[prop][1], splits) for prop, layer, pname in jobs]
    fits = fit_cached_many(tasks, fit_cache, processes=thread_budget())
    for (prop, layer, pname), (probe, source, seconds) in zip(jobs, track(fits, "probes", ctx.progress, len(jobs))):
        values, y = labels[prop]
        scores = score(probe, ex.acts[layer], y, splits, source, seconds)
        rows.append({
            "model": adapter.name, "dataset": ex.dataset.name, "dataset_source": ex.dataset.source,
            "layer": layer, "position": cfg["position"], "property": prop, "probe": pname, **scores,
            "n_classes": len(values), "task_accuracy": task_acc, "n_dropped": ex.n_dropped,
            "method_source": PROBES.provenance(str(probes[pname]["name"])).text,
        })
    ctx.timings["probes_s"] = time.perf_counter() - t0
    cached = sum(r["probe_source"] == "cache" for r in rows)
    if cached:
        log.info("%d of %d probe fits read from the cache (%s)", cached, len(rows), fit_cache)
    return pd.DataFrame(rows)


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """PNG: probe accuracy by layer (one panel per property; lines per model × probe; dashed = majority)."""
    props = sorted(table["property"].unique())
    fig, axes = new_figure(len(props))
    n_test = {}
    for ax, prop in zip(axes, props):
        part = table[table["property"] == prop]
        for (model, probe), g in part.groupby(["model", "probe"]):
            g = g.groupby("layer", as_index=False)[["accuracy", "majority"]].mean()
            ax.plot(g["layer"], g["accuracy"], marker="o", label=f"{model} · {probe}")
        maj = part.groupby("layer")["majority"].mean()
        ax.plot(maj.index, maj.values, "k--", lw=1, label="majority")
        n_test[prop] = plots.values(part["n_test"]) if "n_test" in part else "?"
        ax.set(title=f"{prop} (n_test = {n_test[prop]})", xlabel="layer (0 = embeddings)", ylabel="test accuracy",
               ylim=(0, 1.02))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    plots.caption(fig, "Probe test accuracy by layer (dashed: majority baseline)", property=props,
                  model=table["model"], data=table.get("dataset", "?"), n=plots.counts(n_test, "test items"),
                  seed=table.get("seed"))
    save(fig, out_dir / "accuracy_by_layer.png")


# ----------------------------------------------------------------------------------------------- records
RECORDS = RecordSpec(
    dataset="dataset", model="model", read_layer="layer", position="position", method="probe", family=const("probe"),
    slice=("property",), metrics={"accuracy": "probe_accuracy", "majority": "majority_baseline"}, n={"*": "n_test"},
    extra=lambda t: job_records(t, {"task_accuracy": "task_accuracy"}, {"dataset": "dataset", "model": "model"}))
"""The table's rows as records (:mod:`cprobe.records`); the model's task accuracy once per job."""
