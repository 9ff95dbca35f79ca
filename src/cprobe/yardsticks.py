"""The yardsticks side by side: one row per model × layer × method, one column per study's headline metric.

Input: the long leaderboard (:func:`cprobe.leaderboard.leaderboard`), so every cell is already ``mean [95% interval]``
over seeds (and items). Output: ``yardsticks.{csv,md}`` of ``cprobe collect``. Every rule is read from declared
data, never from a study's name:

- **Which records.** The leaderboard's (headline metrics, whole sets) whose ``family`` names a method family
  (:data:`cprobe.methods.RECORD_FAMILIES`): directions, interventions (the record's family may be an edit kind, ``counterfactual`` /
  ``nullifying``) and explainers. A probe's accuracy, a classifier's or an evaluation setting's are no method on a
  yardstick. A downstream read (``read_layer`` set and not the edited layer) is left to the leaderboard.
- **Which method.** :func:`cprobe.methods.method_of` follows the registries' declared bridges to the method underneath: an
  explainer ``via_<intervention>`` declares its intervention (``intervention``), an intervention bridged from a
  direction declares the direction (``direction_name``: ``probe_direction`` → ``probe``). So the reliability study's
  ``probe_direction``, CausalGym's ``probe`` and CEBaB's ``via_probe_direction`` are one row. A label no registry of
  its family knows (CausalGym's ``probe0`` of a λ grid, ``<name>_dir``) stays a row of its own.
- **Which columns.** ``<study>: <metric title> ↑/↓`` per headline metric of the study, ``[slice]`` added for a slice
  that is not the whole (AxBench's concepts) and ``(dataset)`` where a study ran on several.
- **Which layer.** A record's ``layer``. A study whose records have none (a summary over the layers it ran, such as
  CausalGym's overall odds) fills its columns on every layer row of the model and method, and gets a row without a
  layer where the method has none.
- **Which setting.** Where one method ran in a study at several configurations for one row (reliability's ε grid,
  both kinds, several positions or λ labels that resolve alike), the row shows one of them in all that study's
  columns: the best on the study's deciding metric (:func:`deciding_metric`: the headline metric declared
  ``decides``, else its first headline metric with a direction, in the registry's order; averaged over the slices
  where it has several), ties to the first. The
  ``<study>: which`` column names it (its label where that is not the method's name, its edit kind, position and
  setting; the sweep's overrides that set it apart where there were several) and how many there were.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from cprobe.leaderboard import cell_text, is_blank, setting_text
from cprobe.methods import method_of
from cprobe.metrics.registry import HIGHER, LOWER, METRICS

ARROW = {HIGHER: " ↑", LOWER: " ↓"}
ROW = ("model", "layer", "method")
CONFIG = ("method", "family", "position", "setting", "variant", "config_id")
"""What sets one configuration of a method apart within a study's cells of one row."""


def deciding_metric(metrics: Sequence[str]) -> str | None:
    """Of a study's headline metrics, the one its configurations are ranked by (module doc)."""
    order = [m for m in METRICS if m in set(metrics)]
    declared = [m for m in order if METRICS[m].decides]
    ranked = [m for m in order if METRICS[m].direction in (HIGHER, LOWER)]
    return (declared or ranked or [None])[0]


def _which(config: dict, method: str, n: int, metric: str | None) -> str:
    """What the ``<study>: which`` column says of the chosen configuration."""
    parts = [config["method"] if config["method"] != method else "",
             config["family"] if config["family"] in ("counterfactual", "nullifying") else "",
             "" if is_blank(config["position"]) else f"at {config['position']}", setting_text(config["setting"]),
             "" if is_blank(config["variant"]) or n == 1 else str(config["variant"])]
    text = " ".join(p for p in parts if p)
    if n > 1 and metric:
        text = f"{text} (best {METRICS[metric].title} of {n})".strip()
    return text


def yardsticks(board: pd.DataFrame) -> pd.DataFrame:
    """The wide table (module doc): columns ``model``, ``layer`` (``""``: over layers), ``method``, then per study
    its ``<study>: <metric> ↑`` cells (``mean [low, high]``) and its ``<study>: which``."""
    if board.empty:
        return pd.DataFrame(columns=list(ROW))
    b = board.assign(identity=[method_of(str(m), str(f)) for m, f in zip(board["method"], board["family"])])
    layer, read = (pd.to_numeric(b[c].astype(object), errors="coerce").to_numpy(dtype="float64")
                   for c in ("layer", "read_layer"))
    b = b.assign(layer=layer)[b["identity"].notna().to_numpy() & (np.isnan(read) | np.isnan(layer) | (read == layer))]
    if b.empty:
        return pd.DataFrame(columns=list(ROW))
    several = b.groupby("study")["dataset"].nunique()
    b = b.assign(column=[f"{s}: {METRICS[m].title}{ARROW.get(d, '')}"
                         + (f" ({ds})" if several[s] > 1 else "") + ("" if sl == "{}" else f" [{setting_text(sl)}]")
                         for s, ds, m, d, sl in zip(b["study"], b["dataset"], b["metric"], b["direction"],
                                                    b["slice"])])
    cells: dict[tuple, dict[str, str]] = {}  # (model, layer or None, method) -> column -> text
    columns: dict[str, tuple] = {}  # column -> its place: the study's first appearance, its metrics, then `which`
    whiches: set[str] = set()
    studies = list(dict.fromkeys(zip(b["study"], b["dataset"])))
    metric_order = {m: i for i, m in enumerate(METRICS)}
    for (study, dataset, model, layer, method), g in b.groupby(["study", "dataset", "model", "layer", "identity"],
                                                                sort=False, dropna=False):
        g = g.assign(_config=g.groupby(list(CONFIG), sort=False, dropna=False).ngroup())
        decide = deciding_metric(g["metric"].unique())
        score = g[g["metric"] == decide].groupby("_config")["mean"].mean().dropna()  # over the slices
        best = 0 if score.empty else int(score.idxmax() if METRICS[decide].direction == HIGHER else score.idxmin())
        chosen = g[g["_config"] == best]
        key = (model, None if pd.isna(layer) else int(layer), method)
        row = cells.setdefault(key, {})
        which = f"{study}: which" + (f" ({dataset})" if several[study] > 1 else "")
        place = studies.index((study, dataset))
        for rec in chosen.itertuples(index=False):
            row[rec.column] = cell_text(rec.mean, rec.ci_low, rec.ci_high)
            columns.setdefault(rec.column, (place, 0, metric_order[rec.metric], rec.slice))
        row[which] = _which(chosen.iloc[0].to_dict(), method, g["_config"].nunique(), decide)
        columns.setdefault(which, (place, 1, 0, ""))
        whiches.add(which)
    rows = []
    for (model, layer, method), row in cells.items():
        if layer is not None:
            continue
        layered = [k for k in cells if k[0] == model and k[2] == method and k[1] is not None]
        for k in layered:  # a summary over layers stands beside every layer of the model and method
            for c, v in row.items():
                cells[k].setdefault(c, f"{v} (over layers)".strip() if c in whiches else v)
        if not layered:
            rows.append({"model": model, "layer": "", "method": method, **row})
    rows += [{"model": k[0], "layer": k[1], "method": k[2], **v} for k, v in cells.items() if k[1] is not None]
    out = pd.DataFrame(rows, columns=[*ROW, *sorted(columns, key=columns.__getitem__)]).fillna("")
    order = sorted(range(len(out)), key=lambda i: (str(out["model"].iloc[i]), out["layer"].iloc[i] == "",
                                                   -1 if out["layer"].iloc[i] == "" else int(out["layer"].iloc[i]),
                                                   str(out["method"].iloc[i])))
    out = out.iloc[order].reset_index(drop=True)
    return out.loc[:, [c for c in out.columns if c in ROW or (out[c] != "").any()]]


def markdown(table: pd.DataFrame, kinds: Sequence[str] = ()) -> str:
    """``yardsticks.md``: the rules in brief, then the table."""
    parts = ["# Yardsticks side by side", "",
             "Rows: model × layer × method, the method followed through the registries' bridges (a direction used as "
             "an intervention or an explainer is its direction's row). Columns: each study's headline metrics, "
             "cells mean over seeds [95% interval] as in leaderboard.md; ↑ higher is better, ↓ lower. A study "
             "summarised over layers (layer blank in its records) stands on every layer row of its method. Where a "
             "method ran at several settings, the row shows the one best on the study's deciding metric, named in "
             "`<study>: which`. docs/methods.md has the rules.", ""]
    if kinds:
        parts += ["Intervals in this table: " + "; ".join(kinds) + ".", ""]
    parts.append(table.to_markdown(index=False) if len(table) else "No method on a yardstick in these records.")
    return "\n".join(parts) + "\n"
