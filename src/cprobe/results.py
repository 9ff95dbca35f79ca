"""Metric tables (CSV + Parquet + Markdown, written atomically) and sweep aggregation."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from cprobe.cache import atomic_write_bytes
from cprobe.errors import CprobeError

log = logging.getLogger(__name__)

RESULTS = "results"


def write_table(df: pd.DataFrame, stem: Path) -> None:
    """``stem``.csv, .parquet and .md: all rendered first, then each replaced atomically, so a failure
    leaves the previous tables (or none), never a half-written one."""
    import io

    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    blobs = {".parquet": buf.getvalue(), ".csv": df.to_csv(index=False).encode(), ".md": to_markdown(df).encode()}
    for suffix, data in blobs.items():
        atomic_write_bytes(stem.with_suffix(suffix), data)


def to_markdown(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, floatfmt=".4f") + "\n"


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """Task-specific summaries and figures for one job or an aggregated sweep."""
    from cprobe.tasks import task_module

    for task, part in table.groupby("task"):
        task_module(str(task)).report(part, out_dir)


def _job_overrides(job_dir: Path) -> dict[str, str]:
    """The job's command-line overrides (``.hydra/overrides.yaml``) as columns."""
    import yaml

    f = job_dir / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return {}
    out = {}
    for o in yaml.safe_load(f.read_text()) or []:
        if "=" in o:
            k, v = o.split("=", 1)
            out[f"override.{k.lstrip('+~')}"] = v
    return out


def collect(directory: Path) -> Path:
    """Concatenate every job's ``metrics.parquet`` below ``directory`` into ``results.*`` + figures."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CprobeError(f"{directory} is not a directory; pass a run or sweep output dir (e.g. outputs/sweeps/...)")
    frames = []
    for f in sorted(directory.rglob("metrics.parquet")):
        df = pd.read_parquet(f)
        job = f.parent
        for k, v in _job_overrides(job).items():
            df[k] = v
        df["job"] = str(job.relative_to(directory)) if job != directory else "."
        frames.append(df)
    if not frames:
        raise CprobeError(f"no metrics.parquet under {directory}; did the jobs finish? (see their status.json)")
    table = pd.concat(frames, ignore_index=True)
    write_table(table, directory / RESULTS)
    report(table, directory)
    log.info("aggregated %d job(s), %d rows into %s", len(frames), len(table), directory / "results.csv")
    return directory / f"{RESULTS}.csv"
