"""The reliability study (Canby et al. 2024): intervene on Z_c, score completeness, selectivity,
reliability against oracle probes, and ΔTask Acc by feeding the intervened states back.

One job = one intervention at one hyperparameter setting (a sweep runs a grid). Oracle probes and the
interventional probe shared by gradient attacks are memoised per process, so consecutive jobs of a
sweep (basic launcher) train them once; activations come from the shared cache.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from cprobe.data.registry import load_dataset
from cprobe.data.splits import make_splits
from cprobe.errors import ConfigError
from cprobe.extract import extract, resolve_layers, task_accuracy
from cprobe.interventions import build_intervention
from cprobe.interventions.gbi import GradientIntervention
from cprobe.job import JobContext, probe_config
from cprobe.metrics.reliability import (counterfactual_completeness, nullifying_completeness, reliability,
                                        selectivity)
from cprobe.plots import new_figure, save
from cprobe.probes import Probe, build_probe
from cprobe.results import write_table

log = logging.getLogger("cprobe")

_MEMO: dict[str, Probe] = {}


def _memo_probe(key: Mapping[str, Any], cfg: Mapping[str, Any], X: Tensor, y: Tensor) -> Probe:
    k = json.dumps(key, sort_keys=True, default=str)
    if k not in _MEMO:
        _MEMO[k] = build_probe(cfg).fit(X, y)
    return _MEMO[k]


def counterfactual_targets(z: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Every (row, z′ ≠ z) pair: returns (row indices, targets); for k = 2 each row once."""
    rows = torch.arange(len(z)).repeat_interleave(k - 1)
    offsets = torch.arange(1, k).repeat(len(z))
    return rows, (z[rows] + offsets) % k


def run(ctx: JobContext) -> pd.DataFrame:
    cfg = ctx.cfg
    rcfg = cfg["reliability"]
    adapter = ctx.adapter(cfg["model"])
    ds = load_dataset(cfg["dataset"], ctx.data_root)
    layers = resolve_layers(cfg["layers"], adapter.n_layers)
    if len(layers) != 1:
        raise ConfigError(f"the reliability task takes one layer per job (got {layers}); sweep layers with -m")
    layer = layers[0]
    ex = extract(adapter, ds, [layer], cfg["position"], ctx.cache, progress=ctx.progress)
    data = ex.dataset
    target, others = rcfg["target"], list(rcfg["others"])
    for p in (target, *others):
        if p not in data.properties:
            raise ConfigError(f"property {p!r} not in dataset {data.name!r}; it has {list(data.properties)}")
    seed = int(cfg["seed"])
    splits = make_splits(data, cfg["split"], seed)
    for s in ("oracle", "intervention", "test"):
        if s not in splits:
            raise ConfigError(f"the reliability task needs oracle/intervention/test splits; got {list(splits)}")
    X = ex.acts[layer]
    values = {p: data.values(p) for p in (target, *others)}
    labels = {p: torch.from_numpy(data.labels(p, values[p])) for p in values}
    memo_base = {"acts": [adapter.name, data.fingerprint(), layer, cfg["position"]], "seed": seed,
                 "split": cfg["split"]}

    t0 = time.perf_counter()
    oracles: dict[str, Probe] = {}
    for p in values:
        idx = splits["oracle"][labels[p][splits["oracle"]].numpy() >= 0]
        pc = probe_config(cfg, _probe_cfg(cfg, rcfg["oracle_probe"]))
        oracles[p] = _memo_probe({**memo_base, "oracle": p, "probe": pc}, pc, X[idx], labels[p][idx])
    t_oracle = time.perf_counter() - t0

    te = splits["test"]
    X_te, z_te = X[te], labels[target][te]
    k = len(values[target])
    icfg = dict(cfg["intervention"])
    hparam = icfg.pop("hparam", None)
    method = build_intervention(icfg)
    inter = splits["intervention"]
    t0 = time.perf_counter()
    if isinstance(method, GradientIntervention):
        pc = probe_config(cfg, _probe_cfg(cfg, rcfg["interventional_probe"]))
        probe = _memo_probe({**memo_base, "interventional": target, "probe": pc}, pc, X[inter], labels[target][inter])
        method.use_probe(probe)
    else:
        method.fit(X[inter].to(_device(cfg)), labels[target][inter].to(_device(cfg)))
    t_fit = time.perf_counter() - t0

    t0 = time.perf_counter()
    if method.kind == "counterfactual":
        rows, z_goal = counterfactual_targets(z_te, k)
        X_new = method.transform(X_te[rows].to(_device(cfg)), z_goal.to(_device(cfg))).float().cpu()
    else:
        rows, z_goal = torch.arange(len(te)), None
        X_new = method.transform(X_te.to(_device(cfg))).float().cpu()
    t_apply = time.perf_counter() - t0

    p_hat = oracles[target].predict_proba(X_new)
    comp = (counterfactual_completeness(p_hat, z_goal) if z_goal is not None
            else nullifying_completeness(p_hat)).mean().item()
    sel_parts = {}
    for p in others:
        z_o = labels[p][te][rows]
        mask = z_o >= 0
        if mask.any():
            s = selectivity(oracles[p].predict_proba(X_new), oracles[p].predict_proba(X_te[rows]), mask)
            sel_parts[p] = torch.nanmean(s).item()
    sel = float(np.mean(list(sel_parts.values()))) if sel_parts else float("nan")

    t0 = time.perf_counter()
    acc_before = acc_after = None
    if ex.cand_logits is not None:
        acc_before = task_accuracy(ex.cand_logits[te])
        test_examples = [data.examples[i] for i in te[rows.numpy()]]
        cands = [ex.candidates[i] for i in te[rows.numpy()]]
        lp = adapter.write(test_examples, layer, X_new, cands, cfg["position"],
                           desc="write-back" if ctx.progress else None)
        acc_after = task_accuracy(lp)
    t_task = time.perf_counter() - t0

    row = {
        "model": adapter.name, "dataset": data.name, "layer": layer, "method": icfg["name"],
        "kind": method.kind, "hparam": hparam, "hparam_value": icfg.get(hparam) if hparam else None,
        "completeness": comp, "selectivity": sel, "reliability": float(reliability(comp, sel)) if sel == sel else None,
        "task_acc_before": acc_before, "task_acc_after": acc_after,
        "delta_task_acc": None if acc_before is None else acc_before - acc_after,
        **{f"oracle_acc_{p}": oracles[p].score(X_te[labels[p][te] >= 0], labels[p][te][labels[p][te] >= 0])
           for p in values},
        **{f"selectivity_{p}": v for p, v in sel_parts.items()},
        "n_test": len(te), "n_oracle": len(splits["oracle"]), "n_intervention": len(inter),
        "oracle_s": t_oracle, "fit_s": t_fit, "apply_s": t_apply, "task_s": t_task,
    }
    log.info("%s %s=%s: C=%.3f S=%.3f R=%s ΔTask=%s", icfg["name"], hparam, row["hparam_value"], comp, sel,
             row["reliability"], row["delta_task_acc"])
    return pd.DataFrame([row])


def _probe_cfg(cfg: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    probes = cfg.get("probe") or {}
    if name not in probes:
        raise ConfigError(f"reliability probe {name!r} is not configured; probe= has {sorted(probes)} (use probe=all)")
    return probes[name]


def _device(cfg: Mapping[str, Any]) -> torch.device:
    d = cfg.get("device", "auto")
    if d == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(d)


def table1(table: pd.DataFrame) -> pd.DataFrame:
    """Per method (and model/layer), the hyperparameter setting with maximum reliability."""
    t = table.dropna(subset=["reliability"])
    if t.empty:
        return t
    best = t.loc[t.groupby(["model", "layer", "method"])["reliability"].idxmax()]
    cols = ["model", "layer", "method", "kind", "hparam", "hparam_value", "completeness", "selectivity",
            "reliability", "task_acc_before", "task_acc_after", "delta_task_acc"]
    return best[cols].sort_values(["model", "layer", "reliability"], ascending=[True, True, False])


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """Table 1 (Markdown/CSV) and Figs. 1a, 1b, 2–4 of the paper as PNGs."""
    best = table1(table)
    if not best.empty:
        write_table(best, out_dir / "table1")
    methods = sorted(table["method"].unique())
    fig, (ax_a, ax_b) = new_figure(2)
    for m in methods:
        g = table[table["method"] == m]
        ax_a.scatter(g["completeness"], g["selectivity"], label=m, s=18)
        if g["delta_task_acc"].notna().any():
            ax_b.scatter(g["reliability"], g["delta_task_acc"], label=m, s=18)
    ax_a.set(xlabel="completeness", ylabel="selectivity", title="Fig. 1a: selectivity vs completeness",
             xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    ax_b.set(xlabel="reliability", ylabel="ΔTask Acc", title="Fig. 1b: ΔTask Acc vs reliability")
    for ax in (ax_a, ax_b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, out_dir / "fig1_tradeoffs.png")
    swept = [m for m in methods if table.loc[table["method"] == m, "hparam_value"].nunique() > 1]
    if swept:
        fig, axes = new_figure(len(swept), width=4.0)
        for ax, m in zip(axes, swept):
            g = table[table["method"] == m].sort_values("hparam_value")
            for metric in ("completeness", "selectivity", "reliability"):
                ax.plot(g["hparam_value"], g[metric], marker=".", label=metric)
            hp = g["hparam"].iloc[0]
            ax.set(title=m, xlabel=hp, ylim=(-0.02, 1.02))
            if hp == "eps":
                ax.set_xscale("log")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        save(fig, out_dir / "fig2-4_metrics_vs_hparam.png")
