"""The reliability study's tables and figures (Canby et al. 2024): Table 1 (each method's most reliable setting), the
appendix figures (completeness / selectivity / reliability against each method's setting) and the read-layer table
and heatmap. The study itself: :mod:`cprobe.tasks.reliability`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import cprobe.plots as plots
from cprobe.plots import new_figure, save
from cprobe.results import write_table

log = logging.getLogger("cprobe")


_KIND_ORDER = {"counterfactual": 0, "nullifying": 1}


def table1(table: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 1: per method (and model/layer/oracle), the setting with maximum reliability.

    Counterfactual methods first, then nullifying, each by decreasing R; ``x_opt`` names the
    setting ("eps=0.112", "-" for LEACE); every ``oracle_acc_*`` column is kept.
    """
    t = table.dropna(subset=["reliability"]).reset_index(drop=True)  # idxmax needs unique labels
    if t.empty:
        return t
    keys = [c for c in ("model", "layer", "sites", "mode", "read_layer", "oracle_probe", "method") if c in t.columns]
    best = t.loc[t.groupby(keys, dropna=False)["reliability"].idxmax()].copy()
    best["x_opt"] = [_fmt_setting(h, v) for h, v in zip(best["hparam"], best["hparam_value"])]
    best["_kind"] = best["kind"].map(_KIND_ORDER).fillna(2)
    best = best.sort_values([*keys[:-1], "_kind", "reliability"], ascending=[True] * (len(keys) - 1) + [True, False])
    cols = [*keys, "kind", "x_opt", "completeness", "selectivity", "reliability", "task_acc_before",
            "task_acc_after", "delta_task_acc", *sorted(c for c in t.columns if c.startswith("oracle_acc_")),
            "selectivity_valid", "hparam", "hparam_value"]
    return best[[c for c in cols if c in best.columns]].reset_index(drop=True)


def _fmt_setting(hparam: Any, value: Any) -> str:
    if not isinstance(hparam, str) or value is None or pd.isna(value):
        return "-"
    v = float(value)
    return f"{hparam}={int(v)}" if v.is_integer() and hparam == "rank" else f"{hparam}={v:g}"


_FIGURE_GROUPS = {  # the paper's appendix figures: 2 = GBIs, 3 = AlterRep (+ mean-difference), 4 = nullifying
    "fig2_gbi": ("fgsm", "pgd", "autoattack"),
    "fig3_linear_counterfactual": ("alterrep", "mean_diff"),
    "fig4_nullifying": ("inlp", "rlace", "leace"),
}


def _caption(fig: Any, shows: str, table: pd.DataFrame) -> None:
    """What every reliability figure names: the targeted property, model, data, n (test items) and seed."""
    plots.caption(fig, shows, property=[f"{t} (targeted)" for t in table["target"].unique()],
                  model=[f"{m} layer {l}" for m, l in table[["model", "layer"]].drop_duplicates().itertuples(index=False)],
                  data=table["dataset"], n=plots.counts(plots.values(table["n_test"]), "test items"),
                  seed=table.get("seed"))


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """Table 1 (Markdown/CSV) and Figs. 1a, 1b, 2–4 of the paper as PNGs (figures only for >1 row)."""
    best = table1(table)
    if not best.empty:
        write_table(best, out_dir / "table1")
    if "read_layer" in table.columns and ((table["read_layer"] != table["layer"]) | (table["mode"] != "single")).any():
        rl = read_layer_table(table)  # some job reads downstream or edits several sites
        if not rl.empty:
            write_table(rl, out_dir / "read_layers")
        read_layer_heatmap(table, out_dir / "fig_read_layers.png")
        table = table[table["read_layer"].isna() | (table["read_layer"] == table["layer"])]
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
    _caption(fig, "Interventions: selectivity vs completeness, ΔTask Acc vs reliability (Canby et al. Fig. 1)", table)
    save(fig, out_dir / "fig1_tradeoffs.png")
    swept = [m for m in methods if table.loc[table["method"] == m, "hparam_value"].nunique() > 1]
    for stem, group in (*_FIGURE_GROUPS.items(), ("fig_other", tuple(m for m in swept if not any(
            m in f for f in _FIGURE_GROUPS.values())))):
        ms = [m for m in group if m in swept]
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
        _caption(fig, "Reliability, completeness, selectivity and ΔTask Acc by hyperparameter",
                 table[table["method"].isin(ms)])
        save(fig, out_dir / f"{stem}_metrics_vs_hparam.png")


def _setting_label(row: Mapping[str, Any]) -> str:
    x = _fmt_setting(row.get("hparam"), row.get("hparam_value"))
    return str(row["method"]) if x == "-" else f"{row['method']} {x}"


def read_layer_table(table: pd.DataFrame) -> pd.DataFrame:
    """The downstream-read rows, one per (setting, sites, mode, l′): C, S, R, the oracles' accuracies on the edited
    states (``oracle_acc_edited_*``: how much of each property an oracle trained on clean states at l′ still reads)
    and on the clean ones, and ΔTask (one value per edit: it does not depend on l′)."""
    t = table.dropna(subset=["read_layer"]).copy()
    if t.empty:
        return t
    t["setting"] = [_setting_label(r) for r in t.to_dict("records")]
    keys = [c for c in ("model", "oracle_probe", "setting", "mode", "sites", "layer", "read_layer") if c in t.columns]
    cols = [*keys, "completeness", "selectivity", "reliability",
            *sorted(c for c in t.columns if c.startswith("oracle_acc_edited_")),
            *sorted(c for c in t.columns if c.startswith("oracle_acc_") and not c.startswith("oracle_acc_edited_")),
            "delta_task_acc"]
    return t.sort_values(keys)[[c for c in cols if c in t.columns]].reset_index(drop=True)


def read_layer_heatmap(table: pd.DataFrame, path: Path) -> Path | None:
    """The l × l′ recovery heat-map, one column of panels per setting (single-site edits only): top, the target
    oracle's accuracy at l′ on the states of the pass edited at l (≈ majority = erased there, ≈ the clean accuracy =
    recovered); bottom, reliability R at l′. Written when some setting has more than one (l, l′) cell."""
    t = table.dropna(subset=["read_layer"])
    if "mode" in t.columns:
        t = t[t["mode"] == "single"]
    if t.empty or "target" not in t.columns:
        return None
    t = t.assign(setting=[_setting_label(r) for r in t.to_dict("records")])
    for col in ("oracle_probe", "model"):  # several models / oracles in one table: one panel column each
        if col in t.columns and t[col].nunique() > 1:
            t["setting"] = t[col].astype(str) + "\n" + t["setting"]
    settings = [s for s, g in t.groupby("setting", sort=True) if len(g[["layer", "read_layer"]].drop_duplicates()) > 1]
    if not settings:
        return None
    target = str(t["target"].iloc[0])
    acc_col = f"oracle_acc_edited_{target}"
    ls = sorted({int(v) for v in t["layer"]} | {int(v) for v in t["read_layer"]})
    lo, hi = ls[0], ls[-1]
    n = hi - lo + 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(settings), figsize=(2.3 * len(settings) + 0.6, 4.6), squeeze=False,
                             layout="constrained")
    ims: dict[int, Any] = {}
    for j, setting in enumerate(settings):
        g = t[t["setting"] == setting]
        for i, (col, label, cmap) in enumerate(((acc_col, f"oracle acc. ({target})", "viridis"),
                                                ("reliability", "reliability R", "magma"))):
            grid = np.full((n, n), np.nan)
            chance = np.zeros((n, n), dtype=bool)
            for r in g.itertuples(index=False):
                a, b = int(getattr(r, "layer")) - lo, int(getattr(r, "read_layer")) - lo
                grid[a, b] = getattr(r, col)
                chance[a, b] = not bool(getattr(r, f"oracle_informative_{target}", True))
            ax = axes[i][j]
            im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap=cmap, origin="upper")
            for a in range(n):
                for b in range(n):
                    if not np.isnan(grid[a, b]):
                        ax.text(b, a, f"{'~' if chance[a, b] else ''}{grid[a, b]:.2f}", ha="center", va="center",
                                fontsize=6, color="white" if grid[a, b] < 0.75 else "black")
            ax.set_xticks(range(n), [str(v) for v in range(lo, hi + 1)], fontsize=7)
            ax.set_yticks(range(n), [str(v) for v in range(lo, hi + 1)], fontsize=7)
            ax.set_xlabel("read layer l′", fontsize=7)
            if j == 0:
                ax.set_ylabel(f"edited layer l\n{label}", fontsize=7)
            if i == 0:
                ax.set_title(setting, fontsize=8)
            ims[i] = im
    for i, im in ims.items():
        fig.colorbar(im, ax=list(axes[i]), shrink=0.8)
    plots.caption(fig, f"Does {target} come back downstream? Oracles trained on clean states at l′ read the pass "
                  f"edited at l: accuracy on the original {target} (top), reliability (bottom)",
                  property=f"{target} (targeted)", model=t["model"], data=t["dataset"],
                  n=plots.counts(plots.values(t["n_test"]), "test items"), seed=t.get("seed"),
                  note=f"~: the clean {target} oracle at l′ is at chance")
    save(fig, path)
    return path
