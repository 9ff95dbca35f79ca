"""The prompt-bias study's report: Tables 1, 3 and 4 (with the rank ties and closest pairs), the per-relation spread
and rank instability, and the prompt and stability figures, all read from the study's long table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

import cprobe.plots as plots
from cprobe.plots import new_figure, save
from cprobe.results import summarise

DEFAULT_SETTINGS = ["original", "random", "backdoor", "backdoor_sampled"]
MAIN = "main"  # the variant name of the study's own zoo (controls are named by prompt_bias.controls)


def _cells(s: pd.DataFrame) -> list[str]:
    """Each summary row's cell: ``mean (std)`` over seeds, the mean alone for one seed, ``nan`` when undefined."""
    return ["nan" if np.isnan(m) else f"{m:.2f}" if n <= 1 else f"{m:.2f} ({sd:.2f})"
            for m, sd, n in zip(s["mean"], s["std"], s["seeds"])]


TABLE1 = {"lama_p1": "LAMA P@1", "worst_p1": "Worst P@1", "best_p1": "Best P@1", "std": "Std",
          "diff_gt10_share": "% rel. diff>10", "verbalization_stability": "Verb. stability",
          "p1_backdoor": "P@1 (backdoor)", "true_knowledge": "True knowledge %"}
_ROWS4 = {"overall": "Overall Rank", "any": "Draws with a tie (%)", "pair": "Closest pair",
          "gap": "Closest-pair gap (points)", "flips": "Closest-pair flips (%)"}


def _with_variant(table: pd.DataFrame) -> pd.DataFrame:
    """Tables from before controls existed read as the study's own zoo."""
    if "variant" not in table:
        return table.assign(variant=MAIN)
    return table.assign(variant=table["variant"].fillna(MAIN).replace("", MAIN))


def _index(s: pd.DataFrame) -> list[str]:
    return [k for k in ("config_id", "dataset", "variant", "model") if k in s.columns]


def table1(table: pd.DataFrame) -> pd.DataFrame:
    """Table 1 (+ Fig. 5's mean stability, the backdoor P@1 and, on the fact world, the true knowledge): rows
    (variant, model), cells ``mean (std)`` over seeds."""
    s = summarise(_with_variant(table), "summary", ["dataset", "variant", "model", "metric"])
    if s.empty:
        return s
    s = s[s["metric"].isin(list(TABLE1))]
    s = s.assign(cell=_cells(s))
    wide = s.pivot_table(index=_index(s), columns="metric", values="cell", aggfunc="first", sort=False)
    wide = wide[[k for k in TABLE1 if k in wide.columns]].rename(columns=TABLE1)
    return wide.reset_index()


def table3(table: pd.DataFrame) -> pd.DataFrame:
    """Table 3: rows γ (and ``None``: the base model), columns base models, cells P@1 with the original prompt."""
    s = summarise(table, "disparity", ["dataset", "model", "gamma"])
    if s.empty:
        return s
    s = s.assign(cell=_cells(s), row=["None" if g < 0 else f"{100 * g:g}%" for g in s["gamma"]])
    order = [*[f"{100 * g:g}%" for g in sorted(x for x in s["gamma"].unique() if x >= 0)], "None"]
    wide = s.pivot_table(index="row", columns="model", values="cell", aggfunc="first", sort=False).reindex(order)
    return wide.rename_axis("γ (evidence share)").reset_index()


def pair_table(table: pd.DataFrame) -> pd.DataFrame:
    """Every model pair per (variant, setting): mean gap (points), tied and flipped draws (%), means over seeds;
    closest pair first."""
    s = summarise(_with_variant(table), "rank_pairs", ["dataset", "variant", "setting", "model", "metric"])
    if s.empty:
        return s
    idx = [k for k in ("config_id", "dataset", "variant", "setting", "model") if k in s.columns]
    wide = s.pivot_table(index=idx, columns="metric", values="mean", aggfunc="first", sort=False).reset_index()
    wide = wide.rename(columns={"model": "pair"})
    wide["abs_gap"] = wide["gap"].abs()
    group = [k for k in idx if k != "model"]
    wide = wide.sort_values([*group, "abs_gap"], kind="stable").drop(columns="abs_gap")
    return wide[[*group, "pair", "gap", "tied", "flips"]].reset_index(drop=True)


def table4(table: pd.DataFrame) -> pd.DataFrame:
    """Table 4: rows (variant) models, ``Overall Rank``, the share of draws with a tie and the closest pair (its
    mean gap and the share of draws that flip its order); columns evaluation settings, cells rank consistency (%)."""
    table = _with_variant(table)
    s = summarise(table, "rank_consistency", ["dataset", "variant", "model", "setting"])
    if s.empty:
        return s
    ties = summarise(table, "rank_ties", ["dataset", "variant", "model", "setting"])
    s = pd.concat([s, ties[ties["model"] == "any"]], ignore_index=True)
    s = s.assign(cell=_cells(s))
    pairs = pair_table(table)
    if not pairs.empty:
        first = pairs.groupby([k for k in ("config_id", "dataset", "variant", "setting") if k in pairs.columns],
                              sort=False).head(1)
        extra = []
        for r in first.to_dict("records"):
            base = {k: r[k] for k in ("config_id", "dataset", "variant", "setting") if k in r}
            extra += [{**base, "model": "pair", "cell": r["pair"].replace("|", " / ")},
                      {**base, "model": "gap", "cell": f"{abs(r['gap']):.2f}"},
                      {**base, "model": "flips", "cell": f"{r['flips']:.1f}"}]
        s = pd.concat([s, pd.DataFrame(extra)], ignore_index=True)
    idx = _index(s)
    wide = s.pivot_table(index=idx, columns="setting", values="cell", aggfunc="first", sort=False).reset_index()
    settings = [x for x in DEFAULT_SETTINGS if x in wide.columns] + [x for x in wide.columns
                                                                    if x not in DEFAULT_SETTINGS and x not in idx]
    wide["model"] = wide["model"].replace(_ROWS4)
    know = summarise(table, "summary", ["dataset", "variant", "model", "metric"])
    know = know[know["metric"] == "true_knowledge"]
    if not know.empty:
        on = [k for k in idx if k in know.columns]
        wide = wide.merge(know[[*on, "mean"]].rename(columns={"mean": "true_knowledge"}), on=on, how="left")
        settings.append("true_knowledge")
    return wide[[*idx, *settings]]


def ties_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, model): the share (%) of draws in which its score ties another model's, per setting."""
    s = summarise(_with_variant(table), "rank_ties", ["dataset", "variant", "model", "setting"])
    if s.empty:
        return s
    s = s.assign(cell=_cells(s))
    return s.pivot_table(index=_index(s), columns="setting", values="cell", aggfunc="first", sort=False).reset_index()


def report(table: pd.DataFrame, out_dir: Any) -> None:
    from cprobe.results import write_table

    if "kind" not in table:
        return
    tab = _with_variant(table.copy())
    write_table(table1(tab), out_dir / "prompt_bias_table1")
    t3 = table3(tab)
    if not t3.empty:
        write_table(t3, out_dir / "prompt_bias_table3")
    t4 = table4(tab)
    if not t4.empty:
        write_table(t4, out_dir / "prompt_bias_table4")
        write_table(ties_table(tab), out_dir / "prompt_bias_rank_ties")
        write_table(pair_table(tab), out_dir / "prompt_bias_rank_pairs")
    write_table(summarise(tab, "spread", ["dataset", "variant", "model", "relation", "metric"]),
                out_dir / "prompt_bias_relations")
    write_table(summarise(tab, "rank_instability", ["dataset", "variant", "model"]),
                out_dir / "prompt_bias_rank_instability")
    main = tab[tab["variant"] == MAIN]
    _plot_prompts(main, out_dir)
    _plot_stability(main, out_dir)


def _grid(n: int, ncols: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels in rows of at most ``ncols`` (spare axes hidden)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(1, min(ncols, n))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharey=True)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _plot_prompts(tab: pd.DataFrame, out_dir: Any) -> None:
    """Fig. 3 as box plots: a grid of panels, one per model, one box per relation of its P@1 over the relation's
    prompts (mean over seeds), the original prompt marked."""
    p = tab[tab["kind"] == "p1"]
    if p.empty:
        return
    rows = p
    p = p.groupby(["model", "relation", "prompt"], sort=False)["value"].mean().reset_index()
    models = list(dict.fromkeys(p["model"]))
    relations = list(dict.fromkeys(p["relation"]))
    ncols = 2 if len(relations) > 16 else 4
    fig, axes = _grid(len(models), ncols=ncols,
                      width=max(3.2, min(0.22 * len(relations) + 1.2, 9.0)), height=2.8)
    for i, (ax, model) in enumerate(zip(axes, models)):
        g = p[p["model"] == model]
        data = [g.loc[g["relation"] == r, "value"].to_numpy() for r in relations]
        ax.boxplot(data, showfliers=True)
        orig = [g.loc[(g["relation"] == r) & (g["prompt"] == 0), "value"] for r in relations]
        ax.scatter(np.arange(1, len(relations) + 1), [o.iloc[0] if len(o) else np.nan for o in orig], marker="x",
                   color="tab:red", s=14, label="original prompt", zorder=3)
        ax.set_xticks(np.arange(1, len(relations) + 1), relations, rotation=90, fontsize=6)
        ax.set_ylim(-2, 102)
        ax.set_title(str(model), fontsize=9)
        if i % ncols == 0:
            ax.set_ylabel("P@1 over prompts", fontsize=8)
    axes[0].legend(fontsize=7, loc="upper right")
    _caption(fig, "Prompt preference: P@1 of each relation over its prompts (× the original prompt)", rows,
             "facts per relation")
    save(fig, out_dir / "prompt_bias_prompts.png")


def _caption(fig: Any, shows: str, rows: pd.DataFrame, unit: str) -> None:
    """What every prompt-bias figure names: the relations probed, the model(s), the fact data, n and the seed(s)."""
    ns = rows["n"].dropna().astype(int) if "n" in rows else pd.Series(dtype=int)
    n = "?" if ns.empty else str(ns.min()) if ns.min() == ns.max() else f"{ns.min()}–{ns.max()}"
    plots.caption(fig, shows, property=[f"relation {r}" for r in rows["relation"].dropna().unique()],
                  model=rows["model"], data=rows["dataset"] if "dataset" in rows else "facts",
                  n=f"{n} {unit}", seed=rows.get("seed"))


def _plot_stability(tab: pd.DataFrame, out_dir: Any) -> None:
    """Fig. 5: verbalization stability over relations, one box per model."""
    s = tab[tab["kind"] == "stability"]
    if s.empty:
        return
    rows = s
    s = s.groupby(["model", "relation"], sort=False)["value"].mean().reset_index()
    models = list(dict.fromkeys(s["model"]))
    fig, (ax,) = new_figure(1, width=max(4.0, 0.9 * len(models) + 1.5), height=3.4)
    ax.boxplot([s.loc[s["model"] == m, "value"].to_numpy() for m in models])
    ax.set_xticks(np.arange(1, len(models) + 1), models, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(-2, 102)
    ax.set_ylabel("verbalization stability (%)", fontsize=8)
    _caption(fig, "Verbalization stability: predictions unchanged across subject mentions, per relation", rows,
             "subjects per relation")
    save(fig, out_dir / "prompt_bias_stability.png")
