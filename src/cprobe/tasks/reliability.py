"""The reliability study (Canby et al. 2024): intervene on Z_c, score completeness, selectivity,
reliability against oracle probes, and ΔTask Acc by feeding the intervened states back.

One job = one intervention at one hyperparameter setting (a sweep runs a grid). Oracle probes and the
interventional probe shared by gradient attacks are memoised per process, so consecutive jobs of a
sweep (basic launcher) train them once; activations come from the shared cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
from cprobe.metrics.reliability import (
    counterfactual_completeness,
    nullifying_completeness,
    reliability,
    selectivity,
)
from cprobe.models.load import resolve_device
from cprobe.plots import new_figure, save
from cprobe.probes import Probe, build_probe
from cprobe.probes.linear import load_probe, save_probe
from cprobe.results import write_table

log = logging.getLogger("cprobe")

_MEMO: dict[str, Probe] = {}
_PROBE_CACHE_VERSION = 2  # 2: grid ties broken by validation loss; safetensors files


def _memo_probe(key: Mapping[str, Any], cfg: Mapping[str, Any], X: Tensor, y: Tensor,
                cache_dir: Path | None = None) -> tuple[Probe, str]:
    """Fit ``build_probe(cfg)`` on (X, y) once per key: per process, and on disk when ``cache_dir`` is set
    (every method's sweep is its own process, so the disk copy saves refitting the oracles 8 times).

    Returns (probe, where it came from: "fit", "memory" or "disk").
    """
    k = json.dumps({**key, "v": _PROBE_CACHE_VERSION}, sort_keys=True, default=str)
    if k in _MEMO:
        return _MEMO[k], "memory"
    path = cache_dir / f"{hashlib.sha256(k.encode()).hexdigest()[:24]}.safetensors" if cache_dir else None
    if path is not None and path.is_file():
        try:
            _MEMO[k] = load_probe(build_probe(cfg), path)
            return _MEMO[k], "disk"
        except Exception as e:  # noqa: BLE001 - a stale or torn file: refit and overwrite it
            log.warning("ignoring unreadable cached probe %s (%s)", path, e)
    probe = build_probe(cfg).fit(X, y)
    _MEMO[k] = probe
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_probe(probe, path)
    return probe, "fit"


def counterfactual_targets(z: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Every (row, z′ ≠ z) pair: returns (row indices, targets); for k = 2 each row once.

    Scoring the k − 1 copies of a row and averaging them is the paper's per-embedding
    average over counterfactual values (§3); every row keeps equal weight in C, S and ΔTask.
    """
    if k < 2:
        raise ConfigError(f"a counterfactual intervention needs a property with >= 2 values, got k={k}")
    rows = torch.arange(len(z)).repeat_interleave(k - 1)
    offsets = torch.arange(1, k).repeat(len(z))
    return rows, (z[rows] + offsets) % k


def aggregate_selectivity(parts: Mapping[str, Tensor]) -> tuple[float, dict[str, float]]:
    """Eq. 3 aggregated as in the paper: s(ĥ) = mean over the non-targeted properties that apply to
    that row (NaN = not applicable, e.g. Z_e = none), then S = mean over rows with at least one.

    Returns (S, per-property means). A property that applies to no row is an error, never skipped.
    """
    if not parts:
        raise ConfigError("selectivity needs at least one non-targeted property (reliability.others)")
    empty = [p for p, s in parts.items() if not torch.isfinite(s).any()]
    if empty:
        raise ConfigError(f"non-targeted propert{'ies' if len(empty) > 1 else 'y'} {empty} apply to no test row; "
                          "selectivity cannot be computed (use more data or drop them from reliability.others)")
    per_prop = {p: torch.nanmean(s).item() for p, s in parts.items()}
    per_row = torch.nanmean(torch.stack(list(parts.values()), 1), 1)  # NaN where no property applies
    return torch.nanmean(per_row).item(), per_prop


def run(ctx: JobContext) -> pd.DataFrame:
    t_job = time.perf_counter()
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
    if target in others:
        raise ConfigError(f"reliability.others must not contain the target {target!r}")
    for p in (target, *others):
        if p not in data.properties:
            raise ConfigError(f"property {p!r} not in dataset {data.name!r}; it has {list(data.properties)}")
    seed = int(cfg["seed"])
    splits = make_splits(data, cfg["split"], seed)
    for s in ("oracle", "intervention", "test"):
        if s not in splits:
            raise ConfigError(f"the reliability task needs oracle/intervention/test splits; got {list(splits)}")
    dev = resolve_device(str(cfg.get("device", "auto")))
    X = ex.acts[layer].float()
    values = {p: data.values(p) for p in (target, *others)}
    labels = {p: torch.from_numpy(data.labels(p, values[p])) for p in values}
    memo_base = {"acts": [adapter.name, data.fingerprint(), layer, cfg["position"]], "seed": seed,
                 "split": cfg["split"]}
    probe_dir = (ctx.cache_root / "reliability_probes"
                 if rcfg.get("cache_probes", True) and cfg.get("cache", {}).get("enabled", True) else None)

    # Oracle probes: oracle split only, original embeddings only, one per property.
    t0 = time.perf_counter()
    oracles: dict[str, Probe] = {}
    sources: dict[str, str] = {}
    for p in values:
        idx = splits["oracle"][labels[p][splits["oracle"]].numpy() >= 0]
        pc = probe_config(cfg, _probe_cfg(cfg, rcfg["oracle_probe"]))
        oracles[p], sources[f"oracle_{p}"] = _memo_probe(
            {**memo_base, "oracle": p, "probe": pc}, pc, X[idx].to(dev), labels[p][idx].to(dev), probe_dir)
    t_oracle = time.perf_counter() - t0

    te = splits["test"]
    X_te, z_te = X[te], labels[target][te]
    if (z_te < 0).any():
        raise ConfigError(f"the target {target!r} must be defined for every item (some are {target}=none)")
    k = len(values[target])
    icfg = dict(cfg["intervention"])
    hparam = icfg.pop("hparam", None)
    if hparam is not None and hparam not in icfg:
        raise ConfigError(f"intervention.hparam={hparam!r} is not a key of the intervention config {sorted(icfg)}")
    name = icfg["name"]
    method = build_intervention(icfg)
    inter = splits["intervention"]
    z_inter = labels[target][inter]
    t0 = time.perf_counter()
    if isinstance(method, GradientIntervention):
        # The interventional probe: intervention split, its own object (never an oracle).
        pc = probe_config(cfg, _probe_cfg(cfg, rcfg["interventional_probe"]))
        probe, sources["interventional"] = _memo_probe(
            {**memo_base, "interventional": target, "probe": pc}, pc, X[inter].to(dev), z_inter.to(dev), probe_dir)
        assert all(probe is not o for o in oracles.values())
        method.use_probe(probe)
    else:
        method.fit(X[inter].to(dev), z_inter.to(dev))
    t_fit = time.perf_counter() - t0

    t0 = time.perf_counter()
    if method.kind == "counterfactual":
        rows, z_goal = counterfactual_targets(z_te, k)
        X_new = method.transform(X_te[rows].to(dev), z_goal.to(dev)).float().cpu()
    else:
        rows, z_goal = torch.arange(len(te)), None
        X_new = method.transform(X_te.to(dev)).float().cpu()
    t_apply = time.perf_counter() - t0

    # Completeness on every (test row, goal) pair; selectivity per row over the applicable others.
    p_hat = oracles[target].predict_proba(X_new)
    comp = (counterfactual_completeness(p_hat, z_goal) if z_goal is not None
            else nullifying_completeness(p_hat)).mean().item()
    X_orig = X_te[rows]
    parts = {p: selectivity(oracles[p].predict_proba(X_new), oracles[p].predict_proba(X_orig),
                            labels[p][te][rows] >= 0) for p in others}
    sel, sel_parts = aggregate_selectivity(parts)

    # ΔTask Acc: the same (test row, goal) items before and after writing the intervened states back.
    t0 = time.perf_counter()
    acc_before = acc_after = None
    if ex.cand_logits is not None:
        items = te[rows.numpy()]
        acc_before = task_accuracy(ex.cand_logits[items])
        lp = adapter.write([data.examples[i] for i in items], layer, X_new, [ex.candidates[i] for i in items],
                           cfg["position"], desc="write-back" if ctx.progress else None)
        acc_after = task_accuracy(lp)
    t_task = time.perf_counter() - t0

    hval = icfg.get(hparam) if hparam else None
    row = {
        "model": adapter.name, "dataset": data.name, "layer": layer, "method": name,
        "kind": method.kind, "hparam": hparam, "hparam_value": None if hval is None else float(hval),
        "completeness": comp, "selectivity": sel, "reliability": float(reliability(comp, sel)),
        "task_acc_before": acc_before, "task_acc_after": acc_after,
        "delta_task_acc": None if acc_before is None else acc_before - acc_after,
        **{f"oracle_acc_{p}": oracles[p].score(X_te[labels[p][te] >= 0], labels[p][te][labels[p][te] >= 0])
           for p in values},
        **{f"selectivity_{p}": v for p, v in sel_parts.items()},
        "oracle_probe": rcfg["oracle_probe"],
        "n_test": len(te), "n_scored": len(rows), "n_oracle": len(splits["oracle"]), "n_intervention": len(inter),
        "device": str(dev), "probe_source": ",".join(f"{k_}={v}" for k_, v in sources.items()),
        **{f"fit_{a}": getattr(method, a) for a in ("epochs_run", "probe_accuracy") if hasattr(method, a)},
        "oracle_s": t_oracle, "fit_s": t_fit, "apply_s": t_apply, "task_s": t_task,
        "job_s": time.perf_counter() - t_job,
    }
    log.info("%s %s=%s: C=%.3f S=%.3f R=%.3f ΔTask=%s (%.1fs)", name, hparam, hval, comp, sel,
             row["reliability"], row["delta_task_acc"], row["job_s"])
    return pd.DataFrame([row])


def _probe_cfg(cfg: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    probes = cfg.get("probe") or {}
    if name not in probes:
        raise ConfigError(f"reliability probe {name!r} is not configured; probe= has {sorted(probes)} (use probe=all)")
    return probes[name]


_KIND_ORDER = {"counterfactual": 0, "nullifying": 1}


def table1(table: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 1: per method (and model/layer/oracle), the setting with maximum reliability.

    Counterfactual methods first, then nullifying, each by decreasing R; ``x_opt`` names the
    setting ("eps=0.112", "-" for LEACE); every ``oracle_acc_*`` column is kept.
    """
    t = table.dropna(subset=["reliability"]).reset_index(drop=True)  # idxmax needs unique labels
    if t.empty:
        return t
    keys = [c for c in ("model", "layer", "oracle_probe", "method") if c in t.columns]
    best = t.loc[t.groupby(keys, dropna=False)["reliability"].idxmax()].copy()
    best["x_opt"] = [_fmt_setting(h, v) for h, v in zip(best["hparam"], best["hparam_value"])]
    best["_kind"] = best["kind"].map(_KIND_ORDER).fillna(2)
    best = best.sort_values([*keys[:-1], "_kind", "reliability"], ascending=[True] * (len(keys) - 1) + [True, False])
    cols = [*keys, "kind", "x_opt", "completeness", "selectivity", "reliability", "task_acc_before",
            "task_acc_after", "delta_task_acc", *sorted(c for c in t.columns if c.startswith("oracle_acc_")),
            "hparam", "hparam_value"]
    return best[[c for c in cols if c in best.columns]].reset_index(drop=True)


def _fmt_setting(hparam: Any, value: Any) -> str:
    if not isinstance(hparam, str) or value is None or pd.isna(value):
        return "-"
    v = float(value)
    return f"{hparam}={int(v)}" if v.is_integer() and hparam == "rank" else f"{hparam}={v:g}"


_FAMILIES = {  # the paper's appendix figures: 2 = GBIs, 3 = AlterRep (+ mean-difference), 4 = nullifying
    "fig2_gbi": ("fgsm", "pgd", "autoattack"),
    "fig3_linear_counterfactual": ("alterrep", "mean_diff"),
    "fig4_nullifying": ("inlp", "rlace", "leace"),
}


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """Table 1 (Markdown/CSV) and Figs. 1a, 1b, 2–4 of the paper as PNGs (figures only for >1 row)."""
    best = table1(table)
    if not best.empty:
        write_table(best, out_dir / "table1")
    if len(table) < 2:
        return  # one sweep job: its own row is the table; figures come with `cprobe collect`
    methods = sorted(table["method"].unique())
    fig, (ax_a, ax_b) = new_figure(2)
    for m in methods:
        g = table[table["method"] == m].sort_values("hparam_value")
        ax_a.plot(g["completeness"], g["selectivity"], marker="o", ms=3, lw=0.8, label=m)
        if g["delta_task_acc"].notna().any():
            ax_b.plot(g["reliability"], g["delta_task_acc"], marker="o", ms=3, lw=0.8, label=m)
    ax_a.set(xlabel="completeness", ylabel="selectivity", title="Fig. 1a: selectivity vs completeness",
             xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    ax_b.set(xlabel="reliability", ylabel="ΔTask Acc", title="Fig. 1b: ΔTask Acc vs reliability")
    for ax in (ax_a, ax_b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, out_dir / "fig1_tradeoffs.png")
    swept = [m for m in methods if table.loc[table["method"] == m, "hparam_value"].nunique() > 1]
    for stem, family in (*_FAMILIES.items(), ("fig_other", tuple(m for m in swept if not any(
            m in f for f in _FAMILIES.values())))):
        ms = [m for m in family if m in swept]
        if not ms:
            continue
        fig, axes = new_figure(len(ms), width=4.0)
        for ax, m in zip(axes, ms):
            g = table[table["method"] == m].sort_values("hparam_value")
            for metric, ls in (("reliability", "-"), ("completeness", "--"), ("selectivity", ":")):
                ax.plot(g["hparam_value"], g[metric], ls=ls, marker=".", label=metric)
            if g["delta_task_acc"].notna().any():
                ax.plot(g["hparam_value"], g["delta_task_acc"], ls="-.", color="grey", label="ΔTask Acc")
            hp = g["hparam"].iloc[0]
            ax.set(title=m, xlabel=hp, ylim=(-0.02, 1.02))
            if hp == "eps":
                ax.set_xscale("log")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        save(fig, out_dir / f"{stem}_metrics_vs_hparam.png")
