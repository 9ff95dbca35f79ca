"""The leaderboard: every headline metric of every method, per model and layer, with bootstrap confidence intervals.

Input: records (:mod:`cprobe.records`) of any mix of runs and studies, and their per-item values where a study writes
them. A cell is one record key apart from the seed (study, dataset, model, layer, read layer, position, method,
family, setting, slice, config) and one headline metric (:mod:`cprobe.metrics.registry`); records whose slice breaks
a whole down (a study's ``breakdowns``: per aspect, per relation, ...) are left out.

The interval, named per cell in the ``ci`` column:

- seeds and items: a percentile bootstrap in two stages, resampling the seeds, then each drawn seed's items
  (``n_boot`` resamples, seeded by the cell, so the same records give the same table in any order);
- one seed with items: a percentile bootstrap over the items;
- several seeds, no per-item values: Student's t interval over the seeds, mean ± t(s − 1) · sd / √s. With 2–3
  seeds a bootstrap over the seeds alone is no 95% interval (resampling two values gives exactly their min–max);
  the t interval is one, under normal seed-to-seed variation, and says so;
- one seed, no per-item values: no interval.

Items whose value is NaN (not defined for that item) are left out, as the record's mean leaves them out. The point
estimate is the mean over seeds of the record values (each record's value is the mean of its items).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from cprobe.metrics.registry import HIGHER, LOWER, METRICS
from cprobe.records import KEY, parse_cell, record_key

CELL = tuple(k for k in KEY if k not in ("seed", "metric"))
N_BOOT = 2000
LEVEL = 0.95
COLUMNS = (*CELL, "source", "variant", "metric", "direction", "mean", "ci_low", "ci_high", "seeds", "items", "ci")
CI_TEXT = {
    "seeds+items": "bootstrap over seeds and items",
    "items": "bootstrap over items (one seed)",
    "seeds": "t over seeds (no per-item values)",
    "none": "none (one seed, no per-item values)",
}
"""What the ``ci`` column says of each interval kind (then its settings: resamples or degrees of freedom)."""


def headline(records: pd.DataFrame, breakdowns: Mapping[str, Sequence[str]]) -> pd.DataFrame:
    """The records that go on the leaderboard: headline metrics, slices that are not a breakdown of a whole."""
    heads = {m for m, info in METRICS.items() if info.headline}
    r = records[records["metric"].isin(sorted(heads))]
    if r.empty:
        return r
    keep = [not set(parse_cell(s)) & set(breakdowns.get(str(study), ())) for study, s in zip(r["study"], r["slice"])]
    return r[np.asarray(keep, dtype=bool)]


def _rng(seed: int, key: tuple) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(repr(key).encode())])


def interval(values: np.ndarray, items: Sequence[np.ndarray] | None, n_boot: int = N_BOOT, level: float = LEVEL,
             rng: np.random.Generator | None = None) -> tuple[float, float, str]:
    """(low, high, kind) of the interval of a cell (module doc): ``values`` one per seed, ``items`` (one array per
    seed) their per-item values or None; kind is a key of :data:`CI_TEXT`."""
    rng = rng or np.random.default_rng(0)
    values = np.asarray(values, dtype="float64")
    ok = ~np.isnan(values)
    values = values[ok]
    if items is not None:
        items = [np.asarray(x, dtype="float64") for x, keep in zip(items, ok) if keep]
        items = [x[~np.isnan(x)] for x in items]
        if any(len(x) < 2 for x in items):  # one item per seed: nothing to resample within a seed
            items = None
    s = len(values)
    if s == 0 or (items is None and s == 1):
        return np.nan, np.nan, "none"
    if items is None:
        return (*t_interval(values, level), "seeds")
    drawn = rng.integers(0, s, (n_boot, s)) if s > 1 else np.zeros((n_boot, 1), dtype=int)
    means = np.empty(drawn.shape)
    for j, x in enumerate(items):  # each drawn copy of seed j gets its own resample of j's items
        where = np.nonzero(drawn == j)
        count = len(where[0])
        if count == 0:
            continue
        chunk = max(1, 2_000_000 // max(1, len(x)))
        out = np.empty(count)
        for a in range(0, count, chunk):
            b = min(count, a + chunk)
            out[a:b] = x[rng.integers(0, len(x), (b - a, len(x)))].mean(axis=1)
        means[where] = out
    tail = (1 - level) / 2
    lo, hi = np.quantile(means.mean(axis=1), [tail, 1 - tail])
    return float(lo), float(hi), "seeds+items" if s > 1 else "items"


def t_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Student's t interval of the mean of ``values`` (s >= 2): mean ± t_{(1+level)/2, s−1} · sd / √s, sd with s − 1
    in the denominator."""
    from scipy.stats import t

    v = np.asarray(values, dtype="float64")
    s = len(v)
    half = float(t.ppf((1 + level) / 2, s - 1)) * float(v.std(ddof=1)) / np.sqrt(s)
    m = float(v.mean())
    return m - half, m + half


def ci_text(kind: str, n_boot: int, level: float, seeds: int) -> str:
    """The ``ci`` column: what the interval is and its settings."""
    if kind == "none":
        return CI_TEXT[kind]
    if kind == "seeds":
        return f"{CI_TEXT[kind]} ({level:.0%}, {seeds - 1} df)"
    return f"{CI_TEXT[kind]} ({n_boot} resamples, {level:.0%} percentile)"


def leaderboard(records: pd.DataFrame, items: pd.DataFrame | None = None,
                breakdowns: Mapping[str, Sequence[str]] | None = None, variants: Mapping[str, str] | None = None,
                n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0) -> pd.DataFrame:
    """The long leaderboard (:data:`COLUMNS`): one row per cell × headline metric. ``variants`` {config_id: text}
    names what distinguishes a configuration (a sweep's overrides without the seed)."""
    r = headline(records, breakdowns or {})
    if r.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    item_groups: dict[tuple, np.ndarray] = {}
    if items is not None and len(items):
        for key, g in items.groupby(list(KEY), sort=False, dropna=False):
            item_groups[record_key(key)] = g["value"].to_numpy(dtype="float64")
    rows = []
    cell_keys = [*CELL, "metric"]
    for key, g in r.groupby(cell_keys, sort=False, dropna=False):
        g = g.sort_values("seed", kind="stable")
        values = g["value"].to_numpy(dtype="float64")
        per_seed = [item_groups.get(record_key(rec)) for rec in g[list(KEY)].itertuples(index=False)]
        its = per_seed if per_seed and all(x is not None for x in per_seed) else None
        lo, hi, kind = interval(values, its, n_boot, level, _rng(seed, record_key(key)))
        rec = dict(zip(cell_keys, key))
        info = METRICS[str(rec["metric"])]
        finite = values[~np.isnan(values)]
        used = [int(np.isfinite(x).sum()) for x, v in zip(its, values) if not np.isnan(v)] if its else []
        sources = [x for x in g["source"] if x] if "source" in g else []
        rows.append({**rec, "source": sources[0] if sources else "",
                     "variant": (variants or {}).get(str(rec["config_id"]), ""), "direction": info.direction,
                     "mean": float(finite.mean()) if len(finite) else np.nan, "ci_low": lo, "ci_high": hi,
                     "seeds": int(len(finite)), "items": round(sum(used) / len(used)) if used else 0,
                     "ci": ci_text(kind, n_boot, level, len(finite))})
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    order = {m: i for i, m in enumerate(METRICS)}
    better = np.where(out["direction"] == LOWER, out["mean"], np.where(out["direction"] == HIGHER, -out["mean"], 0.0))
    out = out.assign(_m=out["metric"].map(order), _b=better)
    out = out.sort_values(["study", "dataset", "model", "_m", "layer", "read_layer", "slice", "_b", "method"],
                          kind="stable", na_position="first")
    return out.drop(columns=["_m", "_b"]).reset_index(drop=True)


def number(x: float, like: float | None = None) -> str:
    """Three decimals (one from 100 on, three significant digits below 0.01), as ``like`` is sized."""
    ref = abs(x if like is None else like)
    if x == 0 and ref == 0:
        return "0"
    if ref >= 100:
        return f"{x:.1f}"
    if ref >= 0.01:
        return f"{x:.3f}"
    return f"{x:.3g}"


def cell_text(mean: float, lo: float, hi: float) -> str:
    """``0.812 [0.790, 0.835]``, or the mean alone without an interval."""
    if mean is None or np.isnan(mean):
        return "n/a"
    if lo is None or np.isnan(lo):
        return number(mean)
    return f"{number(mean)} [{number(lo, mean)}, {number(hi, mean)}]"


def setting_text(text: str) -> str:
    """``{"alpha":1.0,"oracle":"mlp"}`` as ``alpha=1.0 oracle=mlp`` (for reading, not parsing)."""
    d = parse_cell(text)
    return " ".join(f"{k}={v}" for k, v in d.items()) if d else ""


def is_blank(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) or str(v) in ("", "{}", "<NA>", "nan")


ROW = ("model", "layer", "read_layer", "position", "slice", "method", "family", "source", "setting", "variant")


def wide(board: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per study (and dataset): rows method × setting per model and layer, one ``mean [low, high]`` column per
    metric (its direction in the header: ↑ higher is better, ↓ lower), then the variant (what else differs) when it
    is not the same on every row."""
    out: dict[str, pd.DataFrame] = {}
    if board.empty:
        return out
    arrow = {HIGHER: " ↑", LOWER: " ↓"}
    for (study, dataset), g in board.groupby(["study", "dataset"], sort=False):
        g = g.assign(cell=[cell_text(m, lo, hi) for m, lo, hi in zip(g["mean"], g["ci_low"], g["ci_high"])],
                     column=[f"{m}{arrow.get(d, '')}" for m, d in zip(g["metric"], g["direction"])])
        outside = "source" in g and any(not is_blank(v) and v != "built-in" for v in g["source"])
        keys = [k for k in ROW if k in g and not all(is_blank(v) for v in g[k]) and (k != "source" or outside)]
        keys = keys or ["method"]
        frame = g.assign(**{k: ["" if is_blank(v) else setting_text(v) if k in ("setting", "slice") else v for v in g[k]]
                            for k in keys})
        t = frame.pivot_table(index=keys, columns="column", values="cell", aggfunc="first", sort=False)
        t = t[list(dict.fromkeys(frame["column"]))].reset_index()
        index = [k for k in keys if k != "variant"]
        t.insert(len(index), "seeds", frame.groupby(keys, sort=False)["seeds"].max().to_numpy())
        if "variant" in t:
            variant = t.pop("variant")
            if variant.nunique() > 1:
                t["variant"] = [v if len(v) <= 90 else v[:89] + "…" for v in variant]
        out[f"{study} · {dataset}" if dataset else str(study)] = t.fillna("")
    return out


def markdown(board: pd.DataFrame) -> str:
    """``leaderboard.md``: how the intervals were computed, then the wide table of each study."""
    parts = ["# Leaderboard", "",
             "Cells: mean over seeds [95% interval]. The interval of each cell is named in column `ci` of "
             "leaderboard.csv: a percentile bootstrap over seeds and items where per-item values exist (items: the "
             "evaluation pairs, tasks or relations a metric averages; NaN items left out), Student's t over the "
             "seeds where they do not; no interval for one seed without per-item values. ↑ higher is better, "
             "↓ lower; `cprobe list metrics` defines every metric.", ""]
    kinds = sorted(set(board["ci"])) if len(board) else []
    if kinds:
        parts += ["Intervals in this table: " + "; ".join(kinds) + ".", ""]
    tables = wide(board)
    for name, t in tables.items():
        parts += [f"## {name}", "", t.to_markdown(index=False), ""]
    if not tables:
        parts.append("No headline metric recorded.")
    return "\n".join(parts) + "\n"
