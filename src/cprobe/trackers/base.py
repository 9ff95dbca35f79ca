"""What every experiment tracker logs, gathered once from a finished job's directory: the resolved config as params,
each record of ``records.parquet`` as a metric (a key built from the record's fields, the layer as the step), the
fields every record shares as tags, the figures and ``report.html`` as artifacts, and the job's status.

A tracker (:class:`Tracker`) only writes what :class:`JobLog` and :class:`SweepLog` hold; it never reads the run
directory itself, so every backend logs the same thing. Nothing here imports a tracker's package."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

ARTIFACT_FILES = ("report.html", "records.parquet", "search.json")
ARTIFACT_GLOBS = ("*.png", "*.csv", "*.md")
"""What a tracker gets as artifacts from a run or sweep root: these files where they exist, and its figures and small
tables (the study's paper tables, metrics, leaderboard, results, timings; ``.parquet`` copies are left out). Never
``status.json`` (the run's state is a tag): a local artifact store under the output root must not look like a job
to ``cprobe collect outputs``."""

STATE_DONE = "done"
KEY_FIELDS = ("model", "dataset", "method", "family", "position", "read_layer", "setting", "slice", "seed")
"""Record fields that become part of a metric's key when they vary among the records of that metric in one job."""
TAG_FIELDS = ("study", "dataset", "model", "method", "family", "position", "setting", "config_id", "seed")
"""Record fields logged as run tags when every record of the job shares one value."""

_BAD = re.compile(r"[^\w\-. /:]")


def clean_key(text: str) -> str:
    """A metric or param name every tracker accepts (MLflow's rule: letters, digits, ``_ - . / : space``)."""
    return _BAD.sub("_", text).strip("/") or "_"


@dataclass(frozen=True)
class Point:
    """One record as a metric: ``key`` (metric name + what sets it apart), ``value``, ``step`` (the layer, or 0)."""

    key: str
    value: float
    step: int
    fields: Mapping[str, Any]


def _json_parts(text: Any) -> list[str]:
    if not isinstance(text, str) or text in ("", "{}"):
        return []
    try:
        d = json.loads(text)
    except ValueError:
        return [str(text)]
    return [f"{k}:{v}" for k, v in sorted(d.items())] if isinstance(d, dict) else [str(d)]


def _part(name: str, value: Any) -> list[str]:
    if name in ("setting", "slice"):
        return _json_parts(value)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value == "":
        return [f"{name}:none"]
    return [f"{name}:{value}"]


def points(records: pd.DataFrame) -> list[Point]:
    """Every record with a finite value as a :class:`Point`. The key is the metric name, then ``field:value`` for
    each field of :data:`KEY_FIELDS` that varies among that metric's records (slice and setting spelled out as their
    ``key:value`` pairs): ``probe_accuracy/method:mlp/property:z_c``. Keys are therefore the same across the jobs of
    a sweep that differ only in what each job holds fixed, so trackers chart them side by side. The step is the
    record's layer (0 when it has none); a record that would still collide gets a ``/layer:none`` or numbered
    suffix, so no value is lost."""
    if records is None or records.empty:
        return []
    out: list[Point] = []
    seen: set[tuple[str, int]] = set()
    for metric, part in records.groupby("metric", sort=True):
        varying = [f for f in KEY_FIELDS if f in part and part[f].astype(str).nunique(dropna=False) > 1]
        layer_na = part["layer"].isna() if "layer" in part else pd.Series(True, index=part.index)
        mixed_na = bool(layer_na.any() and not layer_na.all())
        for idx, row in part.iterrows():
            value = row["value"]
            if value is None or pd.isna(value) or not math.isfinite(float(value)):
                continue
            parts = [str(metric)]
            for f in varying:
                parts += _part(f, row[f])
            if mixed_na and layer_na[idx]:
                parts.append("layer:none")
            key = clean_key("/".join(parts))
            step = 0 if layer_na[idx] else int(row["layer"])
            base, n = key, 1
            while (key, step) in seen:
                n += 1
                key = f"{base}/{n}"
            seen.add((key, step))
            fields = {c: (None if pd.isna(row[c]) else row[c]) if not isinstance(row[c], str) else row[c]
                      for c in records.columns if c not in ("value", "info")}
            out.append(Point(key, float(value), step, fields))
    return out


def shared_tags(records: pd.DataFrame) -> dict[str, str]:
    """``{field: value}`` for the fields of :data:`TAG_FIELDS` that hold one value over all the job's records."""
    if records is None or records.empty:
        return {}
    out = {}
    for f in TAG_FIELDS:
        if f in records:
            vals = records[f].dropna().astype(str).unique()
            if len(vals) == 1 and vals[0] not in ("", "{}"):
                out[f] = str(vals[0])
    return out


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as ``{dotted.key: text}`` (lists and ``None`` as JSON), the form trackers take params in."""
    out: dict[str, str] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v, default=str)
    return out


def artifacts_of(directory: Path) -> list[Path]:
    """The artifacts of a run or sweep root (:data:`ARTIFACT_FILES`, :data:`ARTIFACT_GLOBS`, also in a collected
    directory's per-study sub-directories), never descending into its jobs."""
    directory = Path(directory)
    files = [directory / n for n in ARTIFACT_FILES if (directory / n).is_file()]
    files += [f for pattern in ARTIFACT_GLOBS for f in sorted(directory.glob(pattern))]
    for sub in sorted(p for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else ():
        if not (sub / "status.json").exists() and not any(sub.rglob("status.json")) and not sub.name.startswith("."):
            files += [f for pattern in ARTIFACT_GLOBS for f in sorted(sub.glob(pattern))]  # per-study tables, figures
    return files


@dataclass
class JobLog:
    """What a tracker logs for one job."""

    out_dir: Path
    run_name: str  # the job's sub-directory in a sweep, else <experiment>/<time>
    experiment: str  # the config's `name`
    params: dict[str, str]  # the resolved config, flattened: {dotted.key: text}
    records: pd.DataFrame | None
    status: dict[str, Any]
    overrides: list[str] = field(default_factory=list)  # the job's command-line overrides (hparams for TensorBoard)
    sweep_dir: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config, nested

    @property
    def state(self) -> str:
        return str(self.status.get("state", "unknown"))

    @property
    def ok(self) -> bool:
        return self.state == STATE_DONE

    @property
    def points(self) -> list[Point]:
        return points(self.records)

    @property
    def tags(self) -> dict[str, str]:
        tags = {f"cprobe.{k}": v for k, v in shared_tags(self.records).items()}
        tags.update({"cprobe.state": self.state, "cprobe.run_dir": str(self.out_dir)})
        if self.status.get("error"):
            tags["cprobe.error"] = str(self.status["error"])[:5000]
        if self.sweep_dir is not None:
            tags["cprobe.sweep_dir"] = str(self.sweep_dir)
        return tags

    @property
    def artifacts(self) -> list[Path]:
        return artifacts_of(self.out_dir)

    def hparams(self) -> dict[str, str]:
        """The job's own overrides as ``{key: value}`` (what a sweep varies), without presets and loggers."""
        out = {}
        for o in self.overrides:
            k, sep, v = o.partition("=")
            k = k.lstrip("+~")
            if sep and k.split(".")[0].split("/")[0] not in ("experiment", "debug", "sweep", "logger",
                                                             "hparams_search", "hydra"):
                out[k] = v
        return out


@dataclass
class SweepLog:
    """What a tracker logs for a sweep (the parent of its jobs' runs) when it ends."""

    sweep_dir: Path
    run_name: str  # <experiment>/<time>
    experiment: str
    overrides: list[str]
    failed: list[str]  # jobs that failed or were skipped
    search: dict[str, Any] | None = None  # search.json of an hparams search

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def artifacts(self) -> list[Path]:
        return artifacts_of(self.sweep_dir)

    def search_points(self) -> Iterator[tuple[int, float]]:
        """(trial number, objective value) of each finished trial of a search, in order."""
        for t in (self.search or {}).get("trials", []):
            v = t.get("value")
            if t.get("state") == "COMPLETE" and v is not None and math.isfinite(float(v)):
                yield int(t["number"]), float(v)


class Tracker:
    """One experiment tracker. ``handle`` is what :meth:`start_sweep` returns (JSON-able: it is written to the sweep
    root's ``trackers.json`` and read back by each job, in whatever process or machine it runs); ``log_job`` returns
    what identifies the job's run (kept in the job's ``trackers.json``)."""

    name: str = ""

    def __init__(self, options: Any) -> None:
        self.options = options

    def destination(self) -> str:
        """Where this tracker writes (a tracking URI, a log dir): a job logged to one destination is not logged
        there again on a rerun."""
        raise NotImplementedError

    def start_sweep(self, sweep_dir: Path, run_name: str, experiment: str, overrides: Sequence[str]) -> dict:
        raise NotImplementedError

    def log_job(self, job: JobLog, parent: Mapping[str, Any] | None) -> dict:
        raise NotImplementedError

    def end_sweep(self, sweep: SweepLog, parent: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def discard_sweep(self, parent: Mapping[str, Any]) -> None:
        """Remove what :meth:`start_sweep` made, for a sweep refused before any job ran."""
