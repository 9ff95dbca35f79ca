"""Metric tables (CSV + Parquet + Markdown, written atomically), per-job timings, and finding a sweep's jobs.

A job's ``metrics.*`` hold what it measured and nothing that varies between identical runs: timing columns
(``*_s``, ``seconds``) and provenance columns (where a probe came from) go to ``timings.csv`` beside them, so
the same config and seed give byte-identical metric tables (on the same machine, versions and thread count).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from cprobe.io import atomic_write_bytes, parquet_bytes
from cprobe.paths import relative
from cprobe.sweep import SLURM_DIR  # a SLURM sweep's own files: no job below it

log = logging.getLogger(__name__)

RESULTS = "results"
METRICS = "metrics"
TIMINGS = "timings"
VOLATILE = ("probe_source", "method_source")


def write_table(df: pd.DataFrame, stem: Path, compact: bool = False) -> None:
    """``stem``.csv, .parquet and .md: all rendered first, then each replaced atomically, so a failure
    leaves the previous tables (or none), never a half-written one. ``compact``: the Markdown is
    :func:`compact_markdown` (the CSV and Parquet keep every column)."""
    md = compact_markdown(df) if compact else to_markdown(df)
    blobs = {".parquet": parquet_bytes(df), ".csv": df.to_csv(index=False).encode(), ".md": md.encode()}
    for suffix, data in blobs.items():
        atomic_write_bytes(stem.with_suffix(suffix), data)


def to_markdown(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, floatfmt=".4f") + "\n"


WARNINGS = "warnings"


def _cell(v: object) -> str:
    if isinstance(v, float):
        return "n/a" if v != v else f"{v:.4f}"
    return str(v)


def compact_markdown(df: pd.DataFrame) -> str:
    """A table a person reads: columns that hold one value on every row are stated once above it, the
    ``warnings`` column once below it (each distinct warning once), the varying columns in between."""
    warnings: list[str] = []
    if WARNINGS in df:
        for cell in df[WARNINGS].dropna().astype(str):
            warnings += [w for w in cell.split("; ") if w and w not in warnings]
        df = df.drop(columns=[WARNINGS])
    if len(df) > 1:
        same = [c for c in df.columns if df[c].astype(str).nunique(dropna=False) == 1]
        varying = [c for c in df.columns if c not in same]
        head = " · ".join(f"{c}: {_cell(df[c].iloc[0])}" for c in same)
        body = df[varying].to_markdown(index=False, floatfmt=".4f") if varying else ""
    else:  # one row: a key | value table
        head = ""
        pairs = pd.DataFrame({"key": list(df.columns), "value": [_cell(v) for v in df.iloc[0]] if len(df) else []})
        body = pairs.to_markdown(index=False) if len(df) else "(no rows)"
    parts = [f"All rows: {head}" if head else "", body]
    if warnings:
        parts.append("Warnings:\n" + "\n".join(f"- {w}" for w in warnings))
    return "\n\n".join(p for p in parts if p) + "\n"


def split_volatile(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metrics, timings): the timing/provenance columns apart, each with the row index as ``row``."""
    vol = [c for c in table.columns if c.endswith("_s") or c in ("seconds", *VOLATILE)]
    metrics = table.drop(columns=vol)
    for c in metrics.columns:  # float64 everywhere: float32 prints 0.635 as 0.6349999904632568
        if pd.api.types.is_float_dtype(metrics[c]):
            metrics[c] = metrics[c].astype("float64")
    timings = table[vol].copy()
    timings.insert(0, "row", range(len(table)))
    return metrics, timings


def write_job(table: pd.DataFrame, out_dir: Path, phases: Mapping[str, float] | None = None) -> None:
    """A job's ``metrics.*`` (compact Markdown) and ``timings.csv``: one line per metric row with its timing and
    provenance columns, and the job's phase timings (``phases``, e.g. ``extract_s``) as ``job_<phase>``
    columns."""
    metrics, timings = split_volatile(table.reset_index(drop=True))
    write_table(metrics, out_dir / METRICS, compact=True)
    for name, seconds in (phases or {}).items():
        timings[f"job_{name}"] = seconds
    atomic_write_bytes(out_dir / f"{TIMINGS}.csv", timings.to_csv(index=False).encode())


def job_overrides(job_dir: Path) -> dict[str, str]:
    """The job's command-line overrides (``.hydra/overrides.yaml``) as ``override.<key>`` columns."""
    import yaml

    f = job_dir / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return {}
    parts = [o.partition("=") for o in yaml.safe_load(f.read_text()) or []]
    return {f"override.{k.lstrip('+~')}": v for k, eq, v in parts if eq}


def find_jobs(directory: Path, managed: tuple[dict[Path, bool], list[str]] | None = None
              ) -> tuple[list[Path], list[str]]:
    """(every finished job below ``directory``, descriptions of the jobs that are not done).

    A job is a directory with a ``status.json`` (or a ``metrics.parquet``) below ``directory`` (or it itself).
    ``managed``: ({job dir whose state is known better elsewhere — a SLURM sweep's points, with their scheduler
    state and the points that never started —: whether that says done}, their problems); such a job counts when
    both it and its manager say done, and its problems are these.
    """
    from cprobe.errors import CprobeError
    from cprobe.job import describe_state, read_status

    if not directory.is_dir():
        raise CprobeError(f"{directory} is not a directory; pass a run or sweep output dir (e.g. outputs/sweeps/...)")
    jobs = sorted({p.parent for p in directory.rglob("status.json")} | {p.parent for p in directory.rglob(
        f"{METRICS}.parquet")})
    jobs = [j for j in jobs if SLURM_DIR not in j.relative_to(directory).parts]
    covered, problems = (dict(managed[0]), list(managed[1])) if managed is not None else ({}, [])
    done = []
    for job in jobs:
        status = read_status(job)
        finished = (job / f"{METRICS}.parquet").is_file() and (status is None or status.get("state") == "done")
        if job.resolve() in covered:  # a managed job: counted when done, its problems are the manager's
            if finished and status is not None and covered[job.resolve()]:
                done.append(job)
        elif finished:
            done.append(job)
        else:
            problems.append(f"{relative(job, directory)} is {describe_state(status or {'state': 'unknown'})}")
    if not done:
        raise CprobeError(f"no finished job under {directory}"
                          + (f" ({'; '.join(problems[:3])})" if problems else "; did the jobs run? (see status.json)"))
    return done, problems


def write_results(table: pd.DataFrame, directory: Path) -> Path:
    """A study's jobs' tables, concatenated (with each job's overrides and dir), as ``results.*``."""
    write_table(table, directory / RESULTS, compact=True)
    log.debug("aggregated %d job(s), %d rows", table["job"].nunique(), len(table))
    return directory / f"{RESULTS}.csv"


def summarise(table: pd.DataFrame, kind: str, keys: Sequence[str]) -> pd.DataFrame:
    """Mean, std (over seeds, ddof 1) and seed count of ``value`` for the rows of ``kind``, grouped by ``keys`` — and
    by ``config_id`` when the table mixes settings (a sweep over anything but the task and the seed). Groups keep
    the table's order."""
    part = table[table["kind"] == kind]
    keys = list(keys)
    if "config_id" in part and part["config_id"].nunique() > 1 and "config_id" not in keys:
        keys = ["config_id", *keys]
    if part.empty:
        return pd.DataFrame(columns=[*keys, "mean", "std", "seeds"])
    rows = []
    for key, g in part.groupby(keys, sort=False, dropna=False):
        v = g["value"].dropna().astype(float)
        rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "mean": float(v.mean()),
                     "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0, "seeds": len(v)})
    return pd.DataFrame(rows)
