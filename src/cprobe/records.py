"""One long result record per measurement, the same schema for every study (``records.parquet`` in each job dir).

A study's table (``metrics.*``) keeps its paper's shape; beside it the pipeline writes its records: one row per
(what was measured, on what, by which method, with which setting) — the columns of :data:`COLUMNS`:

============  =========================================================================================================
study         the task that wrote it (``probing``, ``reliability``, ``causalgym``, ``cebab``, ``liberty``, ...)
dataset       the items' dataset (CausalGym: ``causalgym``; LIBERTy: the SCM)
model         the model (``""``: a record about several models, e.g. rank consistency over a zoo)
layer         the layer written to (an intervention's layer; ``<NA>`` when nothing is written)
read_layer    the layer whose states are read for the metric (a probe's or oracle's; ``<NA>``: model outputs only)
position      the token position (rule or CausalGym region) of the site; ``""`` when not a site
method        the method measured (probe, intervention, direction, explainer, classifier, evaluation setting; ``""``:
              a record about the model or the data)
family        the method's family (``probe``, ``counterfactual``/``nullifying``, ``direction``, ``explainer``, ...)
setting       the method's hyperparameters that vary within the study, canonical JSON (``{}``: none)
slice         which part of the data or targets, canonical JSON (``{"property": "z_c"}``, ``{"aspect": "food"}``;
              ``{}``: the whole evaluation set)
metric        a registered metric (:mod:`cprobe.metrics.registry`; ``cprobe list metrics``)
value         float64 (NaN: not defined for this record)
n             how many items the value is computed over: where per-item values are written, the defined ones
              (NaN items are not averaged, so not counted; ``<NA>``: not recorded)
seed          the job's seed
config_id     hash of the job's config without the seed and run-only keys: records with equal ``config_id`` are
              repetitions over seeds of one configuration
info          the study's other columns of the row, JSON in the table's column order (its own vocabulary, e.g.
              CEBaB's ``kind``); ``""`` for records derived from the table (summaries such as CausalGym's overall
              odds), which are not rows of it
source        where the method came from: ``built-in``, ``<package> <version>`` (an installed plugin, or a module of
              the config's ``plugins:`` list that a package provides), or the import path (``my_lab.eraser:Eraser``);
              ``""`` for a record that is not about a registered method (the model's accuracy, a reference row)
plugin_api    the plugin API version (:data:`cprobe.registry.PLUGIN_API_VERSION`) the job ran under
============  =========================================================================================================

Each study declares how its table maps onto the schema with a :class:`RecordSpec` (``RECORDS`` in its task module);
:func:`to_records` and :func:`from_records` apply it both ways, and the inverse is exact: the study's paper tables
are built from ``from_records(records)`` (``pipeline.report``), so they are views of the records.
Optional per-item values (``record_items.parquet``: the record's key, ``item``, ``value``) let ``cprobe collect``
bootstrap over items as well as seeds.

Records are deterministic: the same config and seed give byte-identical files (no timing or provenance columns) on the
same machine, versions and thread count; across CPUs, equal within the tolerances of docs/records.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cprobe.io import write_parquet

RECORDS_FILE = "records.parquet"
ITEMS_FILE = "record_items.parquet"
COLUMNS = ("study", "dataset", "model", "layer", "read_layer", "position", "method", "family", "setting", "slice",
           "metric", "value", "n", "seed", "config_id", "info", "source", "plugin_api")
KEY = tuple(c for c in COLUMNS if c not in ("value", "n", "info", "source", "plugin_api"))
"""What identifies a record (and joins per-item values to it)."""
INTS = ("layer", "read_layer", "n", "seed", "plugin_api")
FIELDS = ("dataset", "model", "layer", "read_layer", "position", "method", "family")
RUN_ONLY_KEYS = ("seed", "force", "progress", "paths", "logger")
"""Job config keys that do not change what is measured (or that ``seed`` repeats): left out of ``config_id``."""


@dataclass(frozen=True)
class Derived:
    """A schema field computed from the table (``fn(table) -> Series`` or a constant); the columns it reads stay in
    ``info``, so the table can be rebuilt from the records."""

    fn: Callable[[pd.DataFrame], Any]

    def __call__(self, table: pd.DataFrame) -> pd.Series:
        v = self.fn(table)
        if isinstance(v, pd.Series):
            return v.reset_index(drop=True)
        if isinstance(v, (list, tuple, np.ndarray)):
            return pd.Series(list(v))
        return pd.Series([v] * len(table), dtype=object)


def const(value: Any) -> Derived:
    """A constant field (e.g. ``family=const("probe")``)."""
    return Derived(lambda t: value)


Field = str | Derived | None
"""A column name (moved into the field, restored by :func:`from_records`), a :class:`Derived`, or None (empty)."""


@dataclass(frozen=True)
class RecordSpec:
    """How one study's table maps onto the record schema.

    Wide tables (one row, several metric columns) set ``metrics`` (column -> metric) and optionally ``patterns``
    (regex with one group -> (metric, slice key): ``oracle_acc_(.+)`` gives ``oracle_accuracy`` with
    ``slice.property``). Long tables (a metric and a value per row) set ``metric`` (a column or a Derived naming each
    row's metric) and ``value``. ``n``: long tables, a column; wide tables, {metric: column} (``"*"``: the default).
    ``slice_defaults``: slice values that mean "the whole" (``aspect: all``), left out of the JSON and restored on
    the way back. ``breakdowns``: slice keys that break a whole down (per aspect, per relation); records with them are
    left out of the leaderboard. ``extra(table)``: records derived from the table (e.g. summaries over sites), written
    with the rows' records but never read back. ``items(table, records, out_dir)``: per-item values (the record key
    columns + ``item`` + ``value``) for the bootstrap, or None.
    """

    dataset: Field = None
    model: Field = "model"
    layer: Field = None
    read_layer: Field = None
    position: Field = None
    method: Field = None
    family: Field = None
    setting: Sequence[str] | Derived = ()
    slice: Sequence[str] | Derived = ()
    slice_defaults: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, str] = field(default_factory=dict)
    patterns: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    metric: Field = None
    value: str = "value"
    n: Any = None
    breakdowns: tuple[str, ...] = ()
    extra: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    items: Callable[[pd.DataFrame, pd.DataFrame, pd.DataFrame | None], pd.DataFrame | None] | None = None
    items_file: str | None = None
    """The job file the task also writes its per-item values to (a documented output): read only to convert a job
    written before records existed; a new job's ``items`` hook gets the values its task returned."""
    outside_metrics: str | None = None
    """Wide tables: the column prefix of outside metrics (``metric_`` -> column ``metric_<name>`` holds metric
    ``<name>`` of the config's ``metrics:``)."""
    where_defined: tuple[str, ...] = ()
    """Wide tables: metrics recorded only on the rows that have a value for them (an SAE's quality exists on the rows
    of SAE methods alone; elsewhere it is no measurement, not an undefined one)."""

    @property
    def wide(self) -> bool:
        return self.metric is None


# ----------------------------------------------------------------------------------------------- JSON
def plain(v: Any) -> Any:
    """A JSON-able Python value: numpy scalars unwrapped, NaN / NA / None as None."""
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return None if math.isnan(f) else (f if math.isfinite(f) else str(f))
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [plain(x) for x in v]
    return str(v)


def canonical(d: Mapping[str, Any]) -> str:
    """Sorted-key, compact JSON: equal dicts give equal strings (the ``setting`` and ``slice`` columns)."""
    return json.dumps(plain(dict(d)), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_cell(s: Any) -> dict[str, Any]:
    """A ``setting``/``slice``/``info`` cell back to a dict ({} for empty)."""
    if s is None or (isinstance(s, float) and math.isnan(s)) or s == "":
        return {}
    return json.loads(s)


def config_id(cfg: Mapping[str, Any]) -> str:
    """12 hex digits naming a job's configuration apart from its seed and run-only keys."""
    from cprobe.config import identity

    body = {k: v for k, v in identity(cfg).items() if k not in RUN_ONLY_KEYS}
    return hashlib.sha256(json.dumps(plain(body), sort_keys=True).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------------------------- table -> records
def _field(t: pd.DataFrame, f: Field) -> tuple[pd.Series, set[str]]:
    if f is None:
        return pd.Series([None] * len(t), dtype=object), set()
    if isinstance(f, Derived):
        return f(t), set()
    if f not in t.columns:
        return pd.Series([None] * len(t), dtype=object), set()
    return t[f].reset_index(drop=True), {f}


def _values(s: pd.Series) -> list[Any]:
    """A column as plain Python values (NaN/NA as None), vectorised."""
    return s.astype(object).where(s.notna(), None).tolist()


def _json_column(t: pd.DataFrame, spec: Sequence[str] | Derived, defaults: Mapping[str, Any] = {}
                 ) -> tuple[list[str], set[str]]:
    """Canonical JSON per row of the columns ``spec`` names (or the dicts a Derived gives), equal rows computed
    once."""
    cache: dict[Any, str] = {}
    out = []
    if isinstance(spec, Derived):
        for d in spec(t):
            d = dict(d) if isinstance(d, Mapping) else {}
            try:
                key = tuple(sorted(d.items()))
                hash(key)
            except TypeError:
                out.append(canonical(d))
                continue
            if key not in cache:
                cache[key] = canonical(d)
            out.append(cache[key])
        return out, set()
    cols = [c for c in spec if c in t.columns]
    for row in zip(*(_values(t[c]) for c in cols)) if cols else [()] * len(t):
        if row not in cache:
            cache[row] = canonical({c: v for c, v in zip(cols, row) if not (c in defaults and v == defaults[c])})
        out.append(cache[row])
    return out, set(cols)


def _pattern(spec: RecordSpec, column: str) -> tuple[str, str, str] | None:
    for regex, (metric, key) in spec.patterns.items():
        m = re.fullmatch(regex, column)
        if m:
            return metric, key, m.group(1)
    return None


def _outside(spec: RecordSpec, column: str) -> str | None:
    """The outside metric a wide table's column holds (``metric_<name>`` -> ``<name>``), or None."""
    p = spec.outside_metrics
    return column[len(p):] if p and column.startswith(p) and len(column) > len(p) else None


def _text(s: pd.Series) -> pd.Series:
    if s.dtype == object and any(isinstance(v, (float, np.floating)) and not math.isnan(v) for v in s):
        return pd.Series(["" if plain(v) is None else str(plain(v)) for v in s], dtype="str")
    return pd.Series(s.astype(object).where(s.notna(), "").astype(str).to_numpy(), dtype="str")


def _ints(s: pd.Series) -> pd.Series:
    try:
        return pd.Series(pd.array(pd.to_numeric(s.astype(object).where(s.notna(), None)), dtype="Int64"))
    except (TypeError, ValueError):
        return pd.Series(pd.array([None if plain(v) is None else int(plain(v)) for v in s], dtype="Int64"))


def finish(frame: pd.DataFrame, study: str = "", seed: int | None = None, config: str = "") -> pd.DataFrame:
    """Records with every schema column, in order and typed (missing text columns ``""``, missing integers NA)."""
    fill = {"study": study, "seed": seed, "config_id": config, "setting": "{}", "slice": "{}"}
    if study:  # new records get plugin_api; records read from older files keep NA
        from cprobe.registry import PLUGIN_API_VERSION

        fill["plugin_api"] = PLUGIN_API_VERSION
    out = {}
    for c in COLUMNS:
        col = (frame[c].reset_index(drop=True) if c in frame.columns
               else pd.Series([fill.get(c)] * len(frame), dtype=object))
        if c in INTS:
            out[c] = _ints(col)
        elif c == "value":
            out[c] = pd.to_numeric(col, errors="coerce").astype("float64")
        else:
            out[c] = _text(col)
    return pd.DataFrame(out, columns=list(COLUMNS))


def to_records(table: pd.DataFrame, spec: RecordSpec, study: str, seed: int | None, config: str,
               sources: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The records of one job's table (see the module doc); ``table`` without timing columns. ``sources``: method ->
    where it came from (the ``source`` column; a method not in it gets ``""``)."""
    t = table.reset_index(drop=True)
    moved: set[str] = {"task", "seed"}
    fields: dict[str, pd.Series] = {}
    for name in FIELDS:
        fields[name], used = _field(t, getattr(spec, name))
        moved |= used
    settings, used = _json_column(t, spec.setting)
    moved |= used
    slices, used = _json_column(t, spec.slice, spec.slice_defaults)
    moved |= used
    slice_dicts: dict[str, dict] = {}
    if spec.wide:
        metric_cols = [c for c in t.columns if c in spec.metrics or _pattern(spec, c) or _outside(spec, c)]
        moved |= set(metric_cols)
    else:
        metric_cols = []
        names, used = _field(t, spec.metric)
        moved |= used | ({spec.value} if spec.value in t.columns else set())
        ns, used = _field(t, spec.n if isinstance(spec.n, (str, Derived)) else None)
        moved |= used
    info_cols = [c for c in t.columns if c not in moved]
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
    infos = [dumps(dict(zip(info_cols, row))) for row in zip(*(_values(t[c]) for c in info_cols))] \
        if info_cols else ["{}"] * len(t)
    base = pd.DataFrame({**fields, "setting": settings, "info": infos})
    if spec.wide:
        parts = []
        for order, col in enumerate(metric_cols):
            pat = _pattern(spec, col)
            metric = spec.metrics.get(col, _outside(spec, col)) if pat is None else pat[0]
            if pat is None:
                sl = slices
            else:
                for s in set(slices):
                    slice_dicts.setdefault(s, parse_cell(s))
                extended = {s: canonical({**slice_dicts[s], pat[1]: pat[2]}) for s in set(slices)}
                sl = [extended[s] for s in slices]
            ncol = (spec.n.get(metric, spec.n.get("*")) if isinstance(spec.n, Mapping)
                    else spec.n if isinstance(spec.n, str) else None)
            parts.append(base.assign(slice=sl, metric=metric,
                                     value=pd.to_numeric(t[col], errors="coerce").astype("float64"),
                                     n=t[ncol] if ncol in t.columns else None, _row=np.arange(len(t)), _order=order))
        recs = pd.concat(parts, ignore_index=True) if parts else base.iloc[:0]
        if parts:
            recs = recs.sort_values(["_row", "_order"], kind="stable").drop(columns=["_row", "_order"])
        if spec.where_defined and len(recs):
            recs = recs[~(recs["metric"].isin(spec.where_defined) & recs["value"].isna())]
    else:
        recs = base.assign(slice=slices, metric=names,
                           value=pd.to_numeric(t[spec.value], errors="coerce") if spec.value in t else np.nan,
                           n=ns)
    recs = finish(recs, study, seed, config)
    if spec.extra is not None:
        more = spec.extra(table.reset_index(drop=True))
        if more is not None and len(more):
            more = more.assign(info="")
            recs = pd.concat([recs, finish(more, study, seed, config)], ignore_index=True)
    if sources:
        recs["source"] = pd.Series([sources.get(m, "") for m in recs["method"]], dtype="str")
    return recs.reset_index(drop=True)


def method_sources(table: pd.DataFrame, spec: RecordSpec, sources: Sequence[Any]) -> dict[str, str]:
    """{method: source} from a table's per-row ``method_source`` values (aligned with its rows), the method read as
    the spec reads it."""
    methods, _ = _field(table.reset_index(drop=True), spec.method)
    return {str(m): str(s) for m, s in zip(_values(methods), sources) if m not in (None, "") and s not in (None, "")
            and not (isinstance(s, float) and math.isnan(s))}


# ----------------------------------------------------------------------------------------------- records -> table
def _restore(values: list[Any]) -> pd.Series:
    """A column from JSON values with the dtype a table built from Python rows gets (ints stay ints, bools bools)."""
    if all(v is None for v in values):  # NaN everywhere (text columns hold "", never null)
        return pd.Series([np.nan] * len(values), dtype="float64")
    s = pd.Series(values)
    if s.dtype == object and all(isinstance(v, bool) for v in values if v is not None) and None not in values:
        return s.astype(bool)
    return s


def from_records(records: pd.DataFrame, spec: RecordSpec) -> pd.DataFrame:
    """The study's table from its records (the exact inverse of :func:`to_records` for the rows' records)."""
    r = records[records["info"] != ""].reset_index(drop=True)
    if spec.wide:
        names = {m: c for c, m in spec.metrics.items()}
        pats = {metric: (regex, key) for regex, (metric, key) in spec.patterns.items()}
        if spec.outside_metrics:  # metrics that are no column of the spec's: the outside ones, back to metric_<name>
            from cprobe.metrics.registry import METRICS

            names.update({m: f"{spec.outside_metrics}{m}" for m in set(r["metric"]) - set(names) - set(pats)
                          if m not in METRICS or METRICS[m].fn is not None})
        r = r[r["metric"].isin(set(names) | set(pats))].reset_index(drop=True)
    if r.empty:
        return pd.DataFrame()
    slices = [parse_cell(s) for s in r["slice"]]
    if spec.wide:
        columns = []
        for i, (metric, sl) in enumerate(zip(r["metric"], slices)):
            pat = pats.get(metric)
            if pat is not None and pat[1] in sl:
                key_value = sl.pop(pat[1])
                columns.append(_column_of(pat[0], str(key_value)))
            else:
                columns.append(names[metric])
        r = r.assign(_slice=[canonical(s) for s in slices], _column=columns)
        ident = [c for c in COLUMNS if c not in ("metric", "value", "n", "slice")] + ["_slice"]
        r["_row"] = r.groupby(ident, sort=False, dropna=False).ngroup()
        values = r.pivot_table(index="_row", columns="_column", values="value", aggfunc="first", sort=False,
                               dropna=False)
        values = values[list(dict.fromkeys(r["_column"]))]
        first = r.drop_duplicates("_row").set_index("_row").loc[values.index]
        rows = first.reset_index(drop=True)
        slices = [parse_cell(s) for s in rows["_slice"]]
    else:
        rows = r
        values = None
    out: dict[str, Any] = {}
    for name in FIELDS:
        f = getattr(spec, name)
        if isinstance(f, str) and f not in out:
            out[f] = _field_back(rows[name], name)
    if not isinstance(spec.setting, Derived):
        settings = [parse_cell(s) for s in rows["setting"]]
        for c in spec.setting:
            if any(c in s for s in settings):
                out[c] = _restore([s.get(c) for s in settings])
    if not isinstance(spec.slice, Derived):
        for c in spec.slice:
            if any(c in s for s in slices) or c in spec.slice_defaults:
                out[c] = _restore([s.get(c, spec.slice_defaults.get(c)) for s in slices])
    if not spec.wide:
        if isinstance(spec.metric, str):
            out[spec.metric] = rows["metric"].astype(str)
        if isinstance(spec.n, str):
            out[spec.n] = _field_back(rows["n"], "n")
        out[spec.value] = rows["value"].astype("float64").to_numpy()
    infos = [parse_cell(s) for s in rows["info"]]
    info_cols = list(dict.fromkeys(k for d in infos for k in d))
    for c in info_cols:
        out[c] = _restore([d.get(c) for d in infos])
    table = pd.DataFrame({k: (v.to_numpy() if isinstance(v, pd.Series) else v) for k, v in out.items()})
    if values is not None:
        for c in values.columns:
            table[c] = values[c].astype("float64").to_numpy()
    table["task"] = rows["study"].astype(str).to_numpy()
    table["seed"] = _field_back(rows["seed"], "seed").to_numpy()
    return table


def _column_of(regex: str, key_value: str) -> str:
    """The column name a pattern's regex gives for one captured value (``oracle_acc_(.+)`` + ``z_c``)."""
    head, _, tail = re.sub(r"\(\?![^)]*\)", "", regex).partition("(")
    close = tail.find(")")
    return head + key_value + tail[close + 1:]


def _field_back(col: pd.Series, name: str) -> pd.Series:
    if name in INTS:
        return col.astype("float64" if col.isna().any() else "int64")
    return col.astype(str)


# ----------------------------------------------------------------------------------------------- files
def write_records(records: pd.DataFrame, out_dir: Path, items: pd.DataFrame | None = None) -> None:
    """``records.parquet`` (and ``record_items.parquet`` when there are per-item values), atomically; an earlier
    ``record_items.parquet`` that no longer belongs to the records is removed when cprobe wrote it (its columns)."""
    write_parquet(records, Path(out_dir) / RECORDS_FILE)
    path = Path(out_dir) / ITEMS_FILE
    if items is not None and len(items):
        write_parquet(finish_items(items), path)
    elif _items_file(path):
        path.unlink()


def _items_file(path: Path) -> bool:
    """Whether ``path`` is a per-item values file :func:`write_records` wrote (any version): Parquet with a record's
    ``config_id`` and ``metric``, an ``item`` and a ``value`` column."""
    import pyarrow.parquet as pq

    try:
        return {"config_id", "metric", "item", "value"} <= set(pq.read_schema(path).names)
    except (OSError, ValueError):  # missing, or not Parquet (ArrowInvalid is a ValueError)
        return False


def read_records(path: Path) -> pd.DataFrame:
    return finish(pd.read_parquet(path))


def finish_items(items: pd.DataFrame) -> pd.DataFrame:
    """Per-item values with the record key columns, typed as the records' (+ ``item`` text, ``value`` float)."""
    base = finish(items.drop(columns=["item"], errors="ignore"))
    out = base[list(KEY)].copy()
    out["item"] = _text(items["item"].reset_index(drop=True))
    out["value"] = base["value"]
    return out


def item_rows(records: pd.DataFrame, values: Mapping[str, Sequence[float]], items: Sequence[Any]) -> pd.DataFrame:
    """Per-item values for records: ``values[metric]`` (one per item) for the record of that metric in ``records``
    (one record per metric), labelled by ``items``."""
    frames = []
    for _, rec in records.iterrows():
        v = values.get(rec["metric"])
        if v is None:
            continue
        frames.append(pd.DataFrame({**{k: [rec[k]] * len(items) for k in KEY}, "item": [str(i) for i in items],
                                    "value": np.asarray(v, dtype="float64")}))
    return finish_items(pd.concat(frames, ignore_index=True)) if frames else _no_items()


def record_key(values: Sequence[Any]) -> tuple:
    """A record key as plain hashable values (NA/NaN as None, numpy scalars unwrapped): equal keys join."""
    return tuple(None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))
                 else int(v) if isinstance(v, np.integer) else v for v in values)


def count_items(records: pd.DataFrame, items: pd.DataFrame | None) -> pd.DataFrame:
    """The records with ``n`` = how many of their per-item values are defined — the items the value actually
    averages (a NaN item, e.g. selectivity on a row where no non-targeted property applies, is left out of the mean
    and so of ``n``); records without per-item values keep theirs."""
    if items is None or not len(items) or not len(records):
        return records
    used: dict[tuple, int] = {}
    ok = items["value"].notna().to_numpy()
    for key, good in zip(items[list(KEY)].itertuples(index=False, name=None), ok):
        k = record_key(key)
        used[k] = used.get(k, 0) + int(good)
    n = [used.get(record_key(key)) for key in records[list(KEY)].itertuples(index=False, name=None)]
    if all(v is None for v in n):
        return records
    out = records.copy()
    out["n"] = pd.array([old if v is None else v for v, old in zip(n, out["n"].astype(object))], dtype="Int64")
    return out


def _no_items() -> pd.DataFrame:
    return finish_items(pd.DataFrame(columns=[*KEY, "item", "value"]))


def breakdown_items(records: pd.DataFrame, metrics: Sequence[str], key: str) -> pd.DataFrame:
    """Per-item values from the records themselves: for each whole record (slice without ``key``) of ``metrics``, the
    records that differ only by ``slice[key]`` are its items (CausalGym: tasks; prompt bias: relations)."""
    r = records[records["metric"].isin(list(metrics))]
    if r.empty:
        return _no_items()
    sl = [parse_cell(s) for s in r["slice"]]
    item = [s.pop(key, None) for s in sl]
    r = r.assign(_whole=[canonical(s) for s in sl], _item=item)
    parts = r[r["_item"].notna()]
    wholes = r[r["_item"].isna()]
    ident = [k for k in KEY if k != "slice"] + ["_whole"]
    merged = wholes[ident].drop_duplicates().merge(parts[[*ident, "_item", "value"]], on=ident, how="inner")
    if merged.empty:
        return _no_items()
    merged = merged.rename(columns={"_whole": "slice", "_item": "item"})
    return finish_items(merged[[*KEY, "item", "value"]].reset_index(drop=True))


# ----------------------------------------------------------------------------------------------- checks
def problems(records: pd.DataFrame) -> list[str]:
    """What is wrong with a records frame: schema, unregistered metrics, values outside a metric's range."""
    from cprobe.metrics.registry import METRICS

    if tuple(records.columns) != COLUMNS:
        return [f"columns {list(records.columns)} are not the schema {list(COLUMNS)}"]
    out = []
    unknown = sorted(set(records["metric"]) - set(METRICS))
    if unknown:
        out.append(f"unregistered metric(s) {unknown} (add them to cprobe/metrics/registry.py)")
    for metric, g in records[records["metric"].isin(list(METRICS))].groupby("metric"):
        m = METRICS[str(metric)]
        bad = g[[not m.contains(float(v)) for v in g["value"]]]
        if len(bad):
            out.append(f"{metric}: {len(bad)} value(s) outside {m.range_text}, e.g. {float(bad['value'].iloc[0])!r}")
    for c in ("setting", "slice"):
        for s in records[c].unique():
            try:
                if canonical(parse_cell(s)) != s:
                    out.append(f"{c} {s!r} is not canonical JSON")
            except ValueError:
                out.append(f"{c} {s!r} is not JSON")
    return out


def job_records(table: pd.DataFrame, metrics: Mapping[str, str], fields: Mapping[str, str] | None = None,
                n: str | None = None) -> pd.DataFrame:
    """Records of job-level values that a table repeats on every row (e.g. the model's own task accuracy):
    ``metrics`` {column: metric}, read from the first row; ``fields`` {schema field: column} identify them."""
    if table.empty:
        return pd.DataFrame()
    row = table.iloc[0]
    rows = [{**{f: row[c] for f, c in (fields or {}).items() if c in table.columns}, "metric": metric,
             "value": row[col], "n": row[n] if n and n in table.columns else None}
            for col, metric in metrics.items() if col in table.columns]
    return pd.DataFrame(rows)
