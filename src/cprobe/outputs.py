"""What a job and a sweep write beside their metric tables: records, the studies' paper tables and figures (views of
the records), the leaderboard and ``report.html`` — and ``cprobe collect``, which rebuilds all of it for any mix of
runs and sweeps from the jobs' records (never from their timing columns).

A job dir after :func:`finish_job`::

    metrics.{csv,parquet,md}  timings.csv          the study's own table, and what it cost (pipeline/results)
    records.parquet           record_items.parquet  the long records (cprobe.records) and per-item values
    <paper tables and figures>                      the study's report, built from the records
    leaderboard.{csv,parquet,md}                    headline metrics with bootstrap intervals (cprobe.leaderboard)
    environment.json  report.html                   versions and machine; the self-contained page (cprobe.report)

A collected directory holds the same at its root (``results.*`` = the jobs' tables concatenated), and
``yardsticks.{csv,md}``: every study's headline metrics side by side per model, layer and method
(:mod:`cprobe.yardsticks`); when it mixes studies, each study's ``results.*``, paper tables and figures go to
``<dir>/<study>/``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cprobe import ownership
from cprobe import records as R
from cprobe.errors import CprobeError
from cprobe.io import TMP_SUFFIX
from cprobe.paths import relative

log = logging.getLogger("cprobe")

LEADERBOARD = "leaderboard"
YARDSTICKS = "yardsticks"


def spec_of(study: str) -> R.RecordSpec | None:
    """The study's record mapping (``RECORDS`` in its task module), or None for a study that declares none."""
    from cprobe.tasks import task_module

    return getattr(task_module(study), "RECORDS", None)


def make_records(study: str, table: pd.DataFrame, values: pd.DataFrame | None, config: str,
                 seed: int | None, sources: Any = None) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(records, per-item values or None) of one job's metric table (without timing columns); ``values``: the
    per-item values its task returned (:class:`cprobe.tasks.TaskResult`), None without; ``sources``: the table's
    per-row ``method_source`` values (where each row's method came from), when the study wrote them."""
    spec = spec_of(study)
    if spec is None:
        return R.finish(pd.DataFrame()), None
    recs = R.to_records(table, spec, study, seed, config,
                        R.method_sources(table, spec, list(sources)) if sources is not None else None)
    items = spec.items(table, recs, values) if spec.items is not None else None
    recs = R.count_items(recs, items)  # n: the items a value averages (NaN items excluded)
    for p in R.problems(recs):
        log.warning("%s records: %s", study, p)
    return recs, items


def study_table(study: str, records: pd.DataFrame) -> pd.DataFrame:
    """The study's table rebuilt from its records (the paper tables are computed from this)."""
    spec = spec_of(study)
    if spec is None:
        raise CprobeError(f"study {study!r} declares no record mapping (RECORDS in its task module)")
    return R.from_records(records, spec)


def breakdowns(studies) -> dict[str, tuple[str, ...]]:
    specs = {str(s): spec_of(str(s)) for s in studies}
    return {s: tuple(spec.breakdowns) if spec is not None else () for s, spec in specs.items()}


def write_leaderboard(board: pd.DataFrame, directory: Path) -> None:
    from cprobe.io import atomic_write_bytes
    from cprobe.leaderboard import markdown
    from cprobe.results import write_table

    write_table(board, directory / LEADERBOARD)
    atomic_write_bytes(directory / f"{LEADERBOARD}.md", markdown(board).encode())


def write_yardsticks(board: pd.DataFrame, directory: Path) -> None:
    """``yardsticks.{csv,md}``: the studies' headline metrics side by side per model, layer and method
    (:mod:`cprobe.yardsticks`)."""
    from cprobe.io import atomic_write_bytes
    from cprobe.yardsticks import markdown, yardsticks

    table = yardsticks(board)
    kinds = sorted(set(board["ci"])) if len(board) else []
    atomic_write_bytes(directory / f"{YARDSTICKS}.csv", table.to_csv(index=False).encode())
    atomic_write_bytes(directory / f"{YARDSTICKS}.md", markdown(table, kinds).encode())


def finish_job(study: str, metrics: pd.DataFrame, out_dir: Path, cfg: Mapping[str, Any],
               sources: Any = None, values: pd.DataFrame | None = None,
               models: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """A finished job's records, paper tables (from the records), leaderboard and environment; returns the records.
    ``metrics``: the job's table without timing columns; ``sources``: its rows' ``method_source`` (provenance, kept
    out of the metric tables); ``values``: the task's per-item values; ``models``: what the job's models were
    (``JobContext.models``, for environment.json). ``report.html`` comes after its status (see :func:`write_report`)."""
    from cprobe.leaderboard import leaderboard
    from cprobe.report import write_environment
    from cprobe.tasks import task_module

    out_dir = Path(out_dir)
    seed = int(cfg.get("seed", 0))
    recs, items = make_records(study, metrics, values, R.config_id(cfg), seed, sources)
    R.write_records(recs, out_dir, items)
    spec = spec_of(study)
    table = R.from_records(recs, spec) if spec is not None else metrics
    task_module(study).report(table, out_dir)
    write_leaderboard(leaderboard(recs, items, breakdowns([study])), out_dir)
    write_environment(out_dir, cfg, models)
    return recs


def write_report(directory: Path) -> Path:
    """``report.html`` of a run or a collected directory, from the files in it."""
    from cprobe.report import build_report

    return build_report(Path(directory))


# ----------------------------------------------------------------------------------------------- collect
@dataclass
class Collected:
    """What ``collect`` wrote."""

    directory: Path
    jobs: int
    studies: list[str]
    results: dict[str, Path] = field(default_factory=dict)  # study -> results.csv
    leaderboard: Path | None = None
    yardsticks: Path | None = None
    report: Path | None = None
    skipped: list[str] = field(default_factory=list)


def load_job(job: Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """A finished job's records and per-item values: its ``records.parquet``, or — a job written before records
    existed — its metric table converted now (with the per-item values of its study's documented ``items_file``)."""
    f = job / R.RECORDS_FILE
    if f.is_file():
        items = job / R.ITEMS_FILE
        return R.read_records(f), (pd.read_parquet(items) if items.is_file() else None)
    table = pd.read_parquet(job / "metrics.parquet")
    if "task" not in table or table.empty:
        raise CprobeError(f"{job}: metrics.parquet has no task column and there is no records.parquet; rerun the job")
    study = str(table["task"].iloc[0])
    seed = int(table["seed"].iloc[0]) if "seed" in table and pd.notna(table["seed"].iloc[0]) else None
    cfg = _job_config(job)
    try:
        spec = spec_of(study)
        side = job / spec.items_file if spec is not None and spec.items_file else None
        values = pd.read_parquet(side) if side is not None and side.is_file() else None
        return make_records(study, table, values, R.config_id(cfg) if cfg else "", seed)
    except (KeyError, ValueError, TypeError) as e:
        raise CprobeError(f"{job}: cannot read its {study} table as records ({type(e).__name__}: {e}); rerun the "
                          "job") from None


def _job_config(job: Path) -> dict[str, Any] | None:
    import yaml

    f = job / ".hydra" / "config.yaml"
    try:
        cfg = yaml.safe_load(f.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _load_job_plugins(job: Path) -> None:
    """The job's ``plugins:`` modules and ``metrics:`` (outside metrics), so its records read as it wrote them (a
    metric's direction and range); what no longer imports is a warning, and its metrics stay off the leaderboard."""
    from cprobe.metrics.registry import resolve_metric
    from cprobe.registry import load_plugin_modules

    cfg = _job_config(job) or {}
    try:
        load_plugin_modules(cfg.get("plugins") or [])
        for ref in cfg.get("metrics") or []:
            resolve_metric(str(ref))
    except CprobeError as e:
        log.warning("%s: %s (its outside metrics are left off the leaderboard)", job, e)


def variants(jobs: list[Path], ids: Mapping[Path, set[str]]) -> dict[str, str]:
    """{config_id: the overrides that set its jobs apart from the others (the seed's left out)}."""
    from cprobe.results import job_overrides

    over = {j: {k.removeprefix("override."): v for k, v in job_overrides(j).items() if k != "override.seed"}
            for j in jobs}
    common = set.intersection(*(set(o.items()) for o in over.values())) if over else set()
    out: dict[str, str] = {}
    for j in jobs:
        text = " ".join(f"{k}={v}" for k, v in sorted(set(over[j].items()) - common))
        for cid in ids.get(j, ()):
            out.setdefault(cid, text)
    return out


def collect(directory: Path, partial: bool = False) -> Collected:
    """Aggregate every finished job below ``directory`` (any mix of studies, runs and sweeps) from their records:
    each study's ``results.*`` and paper tables, one leaderboard, the yardsticks table, ``records.parquet`` and
    ``report.html``.

    Unfinished or failed jobs are named in the error; with ``partial`` they are skipped with a warning.
    """
    from cprobe import results
    from cprobe.leaderboard import leaderboard
    from cprobe.mib_format import find_results as mib_results
    from cprobe.sweep import manifest_problems
    from cprobe.tasks import task_module

    directory = Path(directory)
    try:
        jobs, problems = results.find_jobs(directory, manifest_problems(directory))
    except CprobeError:
        if not directory.is_dir() or not mib_results(directory):  # a directory of MIB's result JSON alone is fine
            raise
        jobs, problems = [], []
    if problems and not partial:
        raise CprobeError(f"{len(problems)} job(s) not done: " + "; ".join(problems[:5])
                          + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
                          + " — rerun them, or pass --partial to aggregate the rest")
    for p in problems:
        log.warning("not aggregated: %s", p)
    tables: dict[str, list[pd.DataFrame]] = {}
    all_records, all_items, ids = [], [], {}
    by_study: dict[str, list[Path]] = {}  # each study's jobs
    for job in jobs:
        _load_job_plugins(job)
        recs, items = load_job(job)
        all_records.append(recs)
        if items is not None and len(items):
            all_items.append(items)
        ids[job] = set(recs["config_id"])
        extra = {**results.job_overrides(job), "job": relative(job, directory)}
        for study, part in recs.groupby("study", sort=False):
            table = study_table(str(study), part)
            tables.setdefault(str(study), []).append(table.assign(**extra))
            by_study.setdefault(str(study), []).append(job)
    for path, table in mib_results(directory, jobs):  # MIB's own result JSON beside the jobs (cprobe.mib_format)
        recs, _ = make_records("mib", table, None, f"mib-json:{relative(path, directory)}", 0, table["method_source"])
        all_records.append(recs)
        tables.setdefault("mib", []).append(study_table("mib", recs).assign(job=relative(path, directory)))
    records = pd.concat(all_records, ignore_index=True) if all_records else R.finish(pd.DataFrame())
    items = pd.concat(all_items, ignore_index=True) if all_items else None
    records = R.count_items(records, items)  # jobs written before n counted only the defined items
    out = Collected(directory, len(jobs), sorted(tables), skipped=problems)
    mixed = len(tables) > 1
    # everything is written into a staging dir first, then moved in: a file of the same name that cprobe did not
    # write is never replaced (cprobe.ownership.check_overwrite), and a refused collect leaves nothing behind
    stage = Path(tempfile.mkdtemp(prefix=".collect-", suffix=TMP_SUFFIX, dir=directory))
    try:
        for study, frames in tables.items():
            sub = study if mixed else ""
            if mixed and directory / sub in jobs:  # a job dir that happens to bear the study's name
                sub = f"{study}-collected"
            dest = stage / sub
            dest.mkdir(parents=True, exist_ok=True)
            table = pd.concat(frames, ignore_index=True)
            task_module(study).report(table, dest)
            out.results[study] = directory / results.write_results(table, dest).relative_to(stage)
        if directory not in jobs:  # a sweep or a directory of runs: its records in one file
            R.write_records(records, stage, items)
        names: dict[str, str] = {}
        for study_jobs in by_study.values():  # what sets a configuration apart among its study's jobs
            names.update(variants(study_jobs, ids))
        board = leaderboard(records, items, breakdowns(tables), names)
        write_leaderboard(board, stage)
        write_yardsticks(board, stage)
        written = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
        ownership.check_overwrite(directory, [*written, "report.html"], "cprobe collect")
        for name in written:
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, directory / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    ownership.note_outputs(directory, [*written, "report.html"])
    out.leaderboard = directory / f"{LEADERBOARD}.csv"
    out.yardsticks = directory / f"{YARDSTICKS}.md"
    out.report = write_report(directory)
    log.info("collected %d job(s) of %s into %s (%s)", len(jobs), ", ".join(out.studies), directory,
             ", ".join(str(p.relative_to(directory)) for p in out.results.values()))
    return out
