"""Structural probing by layer: probe accuracy for each property at each layer, with majority baselines.

One extraction (all requested layers in one pass, cached) feeds every probe × property × layer.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from cprobe.data.registry import load_dataset
from cprobe.data.splits import make_splits
from cprobe.errors import ConfigError
from cprobe.extract import extract, resolve_layers
from cprobe.job import JobContext, probe_config
from cprobe.plots import new_figure, save
from cprobe.probes import build_probe

log = logging.getLogger("cprobe")


def majority_baseline(y_train: np.ndarray, y_test: np.ndarray) -> float:
    """Accuracy on test of always predicting the most frequent training class."""
    return float((y_test == np.bincount(y_train).argmax()).mean())


def run(ctx: JobContext) -> pd.DataFrame:
    cfg = ctx.cfg
    adapter = ctx.adapter(cfg["model"])
    ds = load_dataset(cfg["dataset"], ctx.data_root)
    layers = resolve_layers(cfg["layers"], adapter.n_layers)
    ex = extract(adapter, ds, layers, cfg["position"], ctx.cache, progress=ctx.progress)
    ctx.timings["extract_s"] = ex.seconds
    task_acc = ex.task_accuracy
    log.info("%s task accuracy on %s: %s (%d items dropped: verb forms not single tokens)", adapter.name,
             ex.dataset.name, "n/a (no LM head)" if task_acc is None else f"{task_acc:.4f}", ex.dropped)
    splits = make_splits(ex.dataset, cfg["split"], int(cfg["seed"]))
    for name in ("train", "test"):
        if name not in splits:
            raise ConfigError(f"the probing task needs 'train' and 'test' splits; split.fractions has {list(splits)}")
    probes = cfg.get("probe") or {}
    if not probes:
        raise ConfigError("no probe configured; choose one with probe=linear|mlp|all")
    props = list(cfg["properties"])
    for p in props:
        if p not in ex.dataset.properties:
            raise ConfigError(f"property {p!r} not in dataset {ex.dataset.name!r}; it has {list(ex.dataset.properties)}")
    labels: dict[str, tuple[list[str], np.ndarray]] = {}
    for prop in props:
        values = ex.dataset.values(prop)
        if len(values) < 2:
            log.warning("skipping property %s: %s has %s value(s) other than 'none'", prop, ex.dataset.name,
                        len(values))
            continue
        labels[prop] = (values, ex.dataset.labels(prop, values))
    jobs = [(p, l, n) for p in labels for l in layers for n in probes]
    rows, t0 = [], time.perf_counter()
    for prop, layer, pname in tqdm(jobs, desc="probes", disable=not ctx.progress or None):
        values, y = labels[prop]
        tr, va, te = (splits[s][y[splits[s]] >= 0] if s in splits else None for s in ("train", "val", "test"))
        if len(tr) == 0 or len(te) == 0:
            log.warning("skipping %s at layer %d: empty train or test split", prop, layer)
            continue
        X = ex.acts[layer]
        yt = torch.from_numpy(y)
        probe = build_probe(probe_config(cfg, probes[pname]))
        probe.fit(X[tr], yt[tr], *((X[va], yt[va]) if va is not None and len(va) else ()))
        rows.append({
            "model": adapter.name, "dataset": ex.dataset.name, "layer": layer, "property": prop, "probe": pname,
            "accuracy": probe.score(X[te], yt[te]), "majority": majority_baseline(y[tr], y[te]),
            "n_train": len(tr), "n_test": len(te), "n_classes": len(values),
            "best_params": str(getattr(probe, "best_params", "")), "task_accuracy": task_acc,
            "n_dropped": ex.dropped,
        })
    ctx.timings["probes_s"] = time.perf_counter() - t0
    return pd.DataFrame(rows)


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """PNG: probe accuracy by layer (one panel per property; lines per model × probe; dashed = majority)."""
    props = sorted(table["property"].unique())
    fig, axes = new_figure(len(props))
    for ax, prop in zip(axes, props):
        part = table[table["property"] == prop]
        for (model, probe), g in part.groupby(["model", "probe"]):
            g = g.groupby("layer", as_index=False)[["accuracy", "majority"]].mean()
            ax.plot(g["layer"], g["accuracy"], marker="o", label=f"{model} · {probe}")
        maj = part.groupby("layer")["majority"].mean()
        ax.plot(maj.index, maj.values, "k--", lw=1, label="majority")
        ax.set(title=f"{prop}", xlabel="layer (0 = embeddings)", ylabel="test accuracy", ylim=(0, 1.02))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, out_dir / "accuracy_by_layer.png")
