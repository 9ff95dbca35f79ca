"""MIB's aggregates with intervals (:mod:`cprobe.tasks.mib`), and the study's results table.

MIB's ``aggregate_results.py``: a site's (model unit's) IIA is the mean over the counterfactual datasets (kinds) of
their accuracies; per layer the best position; ``highest_accuracy`` the best layer (``mib_best``) and
``average_accuracy`` the mean over layers (``mib_mean``). Intervals: a percentile bootstrap over the test pairs,
resampled within each kind; one draw serves every site and method of a (task, variable), so a cell's interval and the
aggregates' come from the same resamples (:func:`boot_means`).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from cprobe.mib_format import aggregates

LEVEL = 0.95


def boot_means(C: np.ndarray, kinds: np.ndarray, n_boot: int, rng_key: str, seed: int
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per kind: the IIA of each site (S,) and its bootstrap replicates (S, n_boot). ``C`` (S, n) is each site's
    correctness on the n test pairs, ``kinds`` (n,) their kinds; each kind's pairs are resampled with one seeded draw
    for every site (``rng_key``: the task and variable, so every method and control shares it)."""
    point, boot = {}, {}
    for k in dict.fromkeys(kinds.tolist()):
        cols = np.flatnonzero(kinds == k)
        rng = np.random.default_rng([seed, zlib.crc32(f"{rng_key}/{k}".encode())])
        draw = rng.integers(0, len(cols), (n_boot, len(cols)))
        X = C[:, cols].astype(np.float64)
        point[k] = X.mean(1)
        boot[k] = X[:, draw].mean(2)
    return point, boot


def interval(reps: np.ndarray) -> tuple[float, float]:
    tail = (1 - LEVEL) / 2
    lo, hi = np.quantile(reps, [tail, 1 - tail])
    return float(lo), float(hi)


def method_rows(task: str, variable: str, method: str, family: str, control: str, fits: Sequence[Any],
                fit_idx: Sequence[int], res: Any, kinds: np.ndarray, pos_ids: Mapping[str, str], n_boot: int,
                seed: int) -> list[dict[str, Any]]:
    """The cell rows (per site × kind, and ``all``: the mean over kinds) and the two summary rows of one method (or
    one control of it) on one variable."""
    n = len(kinds)
    C = np.zeros((len(fits), n), dtype=bool)
    for s, i in enumerate(fit_idx):
        sel = res.fit == i
        C[s, res.pair[sel]] = res.correct[sel]
    point, boot = boot_means(C, kinds, n_boot, f"{task}/{variable}", seed)
    kind_names = list(point)
    mean_point = np.mean([point[k] for k in kind_names], 0)
    mean_boot = np.mean([boot[k] for k in kind_names], 0)
    common = {"dataset": task, "variable": variable, "method": method, "family": family, "control": control}
    rows = []
    for s, f in enumerate(fits):
        site = {"layer": f.site.layer, "position": pos_ids.get(f.site.position, f.site.position),
                "k": -1 if f.k is None else f.k}
        for k in kind_names:
            rows.append({**common, **site, "kind": "cell", "counterfactual": k, "metric": "iia",
                         "value": float(point[k][s]), "n": int((kinds == k).sum()), **_ci(boot[k][s])})
        rows.append({**common, **site, "kind": "cell", "counterfactual": "all", "metric": "iia",
                     "value": float(mean_point[s]), "n": n, **_ci(mean_boot[s])})
    layers = [f.site.layer for f in fits]
    best, mean, _, at = aggregates(mean_point, layers)
    by_layer = np.asarray(layers)  # the aggregates of every replicate (mean_boot: S, B)
    per_layer = np.stack([mean_boot[by_layer == l].max(0) for l in dict.fromkeys(by_layer.tolist())])  # (L, B)
    rep_best, rep_mean = per_layer.max(0), per_layer.mean(0)
    where = {"best_layer": fits[at].site.layer, "best_position": pos_ids.get(fits[at].site.position, ""),
             "k": -1 if fits[at].k is None else fits[at].k}
    for metric, v, reps in (("mib_best", best, rep_best), ("mib_mean", mean, rep_mean)):
        rows.append({**common, **where, "kind": "summary", "counterfactual": "all", "metric": metric, "value": v,
                     "n": n, **_ci(reps)})
    return rows


def _ci(reps: np.ndarray) -> dict[str, float]:
    lo, hi = interval(reps)
    return {"ci_low": lo, "ci_high": hi}


def results_markdown(table: pd.DataFrame) -> str:
    """The study's table for people: per task and variable, each method's MIB best / mean over layers with the
    controls beside them (``value [95% interval]``), then the models' accuracies (a task not scored says so)."""
    parts = ["# MIB causal variable track", ""]
    acc = table[table["kind"] == "accuracy"] if "n_kept" in table else table.iloc[:0]
    if len(acc):
        parts += ["Task accuracy (greedy output passes MIB's checker; `scored`: at least mib.min_accuracy).", "",
                  acc[["model", "dataset", "value", "n", "n_kept", "scored"]].rename(
                      columns={"value": "accuracy", "n": "test bases", "n_kept": "pairs kept"}).to_markdown(
                      index=False), ""]
    summ = table[table["kind"] == "summary"]
    if len(summ):
        lows, highs = (summ.get(c, pd.Series(np.nan, index=summ.index)) for c in ("ci_low", "ci_high"))
        cell = summ.assign(text=[f"{v:.2f}" + ("" if pd.isna(lo) else f" [{lo:.2f}, {hi:.2f}]") for v, lo, hi in
                                 zip(summ["value"], lows, highs)])  # MIB's imported results carry no interval
        wide = cell.pivot_table(index=["model", "dataset", "variable", "method", "metric"], columns="control",
                                values="text", aggfunc="first").reset_index()
        order = [c for c in ("none", "identity", "rotation", "untrained") if c in wide.columns]
        wide = wide[["model", "dataset", "variable", "method", "metric", *order]].rename(columns={"none": "method IIA"})
        parts += ["MIB's aggregates (`mib_best`: the best layer, `mib_mean`: the mean over layers; per layer the best "
                  "position of the mean IIA over counterfactual kinds), the controls beside them.", "",
                  wide.to_markdown(index=False), ""]
    return "\n".join(parts) + "\n"
