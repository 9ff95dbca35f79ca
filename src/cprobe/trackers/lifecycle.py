"""Experiment trackers, re-exported by :mod:`cprobe.trackers`: the ``logger=`` config group (``csv``, ``mlflow``,
``tensorboard``, ``wandb``; several at once: ``'logger=[csv,mlflow]'``).

``csv`` names the local files every job writes (``metrics.csv``, ``records.parquet``, ``report.html``, ...): they are
always written, whatever the loggers, and nothing a tracker does changes them. Every other logger sends each job —
after its local files are complete — to a tracker: the resolved config as params, every record as a metric, the
figures and ``report.html`` as artifacts, and its status (:mod:`cprobe.trackers.base`); a sweep is a parent run with
one child per job. The Hydra callback (:class:`cprobe.callbacks.AggregateResults`) drives it:

* :func:`preflight` before any run or sweep directory exists: an unknown logger, bad options or a missing package
  is one line and exit 1;
* :func:`sweep_started` in the sweep's process: the parent runs, their ids in ``<sweep>/trackers.json``;
* :func:`job_ended` wherever a job ran (a joblib worker, a SLURM node): the job's runs, noted in the job's
  ``trackers.json`` so a rerun neither logs a finished job twice nor misses one that was never logged;
* :func:`sweep_ended` after the sweep's aggregation: its report, tables and search summary on the parent runs.

A tracker that fails (a server gone, a full disk) warns once and is off for the rest of the process; the job and its
local files are never affected. Trackers' packages are imported only when their logger is used.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from cprobe.errors import ConfigError
from cprobe.io import read_json, write_json
from cprobe.registry import Registry

log = logging.getLogger("cprobe")

TRACKERS_FILE = "trackers.json"
LOCAL = "csv"


@dataclass(frozen=True)
class LoggerSpec:
    """A logger: the module of its :class:`~cprobe.trackers.base.Tracker` (``None``: the local files alone), the
    package it imports and the ``cprobe`` extra that installs it."""

    name: str
    description: str
    tracker: str | None = None  # "module:Class"
    package: str | None = None  # import name
    extra: str | None = None


LOGGERS: Registry[LoggerSpec] = Registry("logger")
for _spec in (
    LoggerSpec(LOCAL, "the local files (metrics.csv, records.parquet, report.html, ...): always written; the default"),
    LoggerSpec("mlflow", "MLflow: a local SQLite store by default, or any tracking URI (a server)",
               "cprobe.trackers.mlflow:MLflowTracker", "mlflow", "mlflow"),
    LoggerSpec("tensorboard", "TensorBoard event files (scalars, figures, hparams) under outputs/tensorboard",
               "cprobe.trackers.tensorboard:TensorBoardTracker", "tensorboard", "tensorboard"),
    LoggerSpec("wandb", "Weights & Biases: online with an API key, else offline runs to sync later",
               "cprobe.trackers.wandb:WandbTracker", "wandb", "wandb"),
):
    LOGGERS.register(_spec.name)(_spec)


def _tracker_class(spec: LoggerSpec) -> Any:
    module, _, cls = str(spec.tracker).partition(":")
    return getattr(importlib.import_module(module), cls)


def check(node: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate the resolved ``logger`` node ({name: options}) without importing a tracker's package: every name is
    a logger, its options are its own, its package is installed. Returns {name: typed options} of the trackers
    (``csv`` has none); raises :class:`ConfigError` in one line."""
    from cprobe.config import parse

    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise ConfigError(f"logger must be a mapping of logger names to options (logger=NAME or "
                          f"'logger=[csv,mlflow]'), got {node!r}")
    out = {}
    for name, options in node.items():
        spec = LOGGERS.get(str(name))
        if spec.tracker is None:
            if options:
                raise ConfigError(f"logger {name!r} has no options, got {dict(options)}")
            continue
        if spec.package and find_spec(spec.package) is None:
            raise ConfigError(f"logger {name!r} needs the {spec.package} package, which is not installed: "
                              f"pip install 'cprobe[{spec.extra}]'")
        out[str(name)] = parse(_tracker_class(spec).Options, options, f"logger.{name}")
    return out


def trackers(node: Mapping[str, Any] | None) -> list[Any]:
    """The trackers the resolved ``logger`` node selects (``csv`` is not one: its files are always written)."""
    return [_tracker_class(LOGGERS.get(name))(options) for name, options in check(node).items()]


def _node(config: Any) -> dict[str, Any] | None:
    """The job's ``logger`` node, resolved (``${name}``, ``${paths.output_root}``)."""
    from omegaconf import OmegaConf

    node = config.get("logger") if hasattr(config, "get") else None
    return None if node is None else OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def preflight(config: Any) -> None:
    """Refuse bad loggers before a run or sweep directory exists (called by the Hydra callback): raises
    :class:`~cprobe.errors.JobAborted`, which Hydra's callback runner lets through to the CLI."""
    from cprobe.errors import JobAborted

    try:
        check(_node(config))
    except ConfigError as e:
        raise JobAborted(e) from None
    except Exception:  # an unresolvable interpolation: the job's own validation says it in its words
        log.debug("logger preflight skipped", exc_info=True)


# ----------------------------------------------------------------------------------------------- failures
_OFF: dict[tuple[str, str], str] = {}
"""(logger, destination) -> why it is off in this process (it failed once)."""


def _guard(tracker: Any, what: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None (with one warning per tracker and destination in this process) when it fails."""
    key = (tracker.name, _destination(tracker))
    if key in _OFF:
        return None
    try:
        return fn(*args)
    except Exception as e:  # a tracker must never fail a job
        why = "; ".join(l.strip() for l in str(e).splitlines() if l.strip())[:400] or type(e).__name__
        _OFF[key] = why
        log.warning("logger %s failed while %s (%s: %s): the job and its local files are complete and unaffected; "
                    "%s logging is off for the rest of this process. Rerunning the same command with "
                    "hydra.run.dir / hydra.sweep.dir set to its directory sends what was missed (finished jobs are "
                    "skipped, then logged).", tracker.name, what, type(e).__name__, why, tracker.name)
        log.debug("logger failure", exc_info=True)
        return None


def _destination(tracker: Any) -> str:
    try:
        return str(tracker.destination())
    except Exception:
        return "?"


# ----------------------------------------------------------------------------------------------- state files
def _active(config: Any) -> list[Any]:
    try:
        node = _node(config)
        if not node or set(node) <= {LOCAL}:
            return []
        return trackers(node)
    except Exception as e:  # refused by preflight/prepare already; never fail here
        log.debug("no trackers: %s", e)
        return []


def _parent(state: Mapping[str, Any], tracker: Any) -> dict[str, Any] | None:
    """``state``'s entry (a ``trackers.json``) for ``tracker`` when it was written for its current destination."""
    entry = state.get(tracker.name)
    return entry if entry is not None and entry.get("destination") == _destination(tracker) else None


def _multirun(config: Any) -> bool:
    from hydra.types import RunMode

    try:
        return config.hydra.mode == RunMode.MULTIRUN
    except Exception:
        return False


# ----------------------------------------------------------------------------------------------- lifecycle
def sweep_started(config: Any) -> None:
    """Open (or, resuming into the same sweep dir, find again) each tracker's parent run."""
    if not (active := _active(config)):
        return
    sweep_dir = Path(config.hydra.sweep.dir)
    state = read_json(sweep_dir / TRACKERS_FILE) or {}
    overrides = [str(o) for o in config.hydra.overrides.task]
    name = str(config.get("name", "cprobe"))
    changed = False
    for t in active:
        if _parent(state, t) is not None:
            continue
        handle = _guard(t, "opening the sweep's parent run", t.start_sweep, sweep_dir, f"{name}/{sweep_dir.name}",
                        name, overrides)
        if handle is not None:
            state[t.name] = {"destination": _destination(t), **handle}
            changed = True
    if changed:
        write_json(sweep_dir / TRACKERS_FILE, state, sort_keys=True)


def gather(config: Any, out_dir: Path, status: Mapping[str, Any], sweep_dir: Path | None) -> Any:
    """The :class:`~cprobe.trackers.base.JobLog` of a finished job: its resolved config, records and status."""
    import copy

    import pandas as pd
    from omegaconf import OmegaConf, open_dict, read_write

    from cprobe.records import RECORDS_FILE
    from cprobe.trackers.base import JobLog, flatten

    cfg = copy.deepcopy(config)
    with read_write(cfg), open_dict(cfg):
        cfg.pop("hydra", None)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # the job failed on exactly this; log the config as written
        plain = OmegaConf.to_container(cfg, resolve=False)
    records = pd.read_parquet(out_dir / RECORDS_FILE) if (out_dir / RECORDS_FILE).is_file() else None
    name = str(plain.get("name", "cprobe"))  # type: ignore[union-attr]
    run_name = str(out_dir.relative_to(sweep_dir)) if sweep_dir is not None and out_dir != sweep_dir \
        and out_dir.is_relative_to(sweep_dir) else f"{name}/{out_dir.name}"
    try:
        overrides = [str(o) for o in config.hydra.overrides.task]
    except Exception:
        overrides = []
    return JobLog(out_dir=out_dir, run_name=run_name, experiment=name, params=flatten(plain),  # type: ignore[arg-type]
                  records=records, status=dict(status), overrides=overrides, sweep_dir=sweep_dir,
                  config=plain)  # type: ignore[arg-type]


def job_ended(config: Any, job_return: Any = None) -> None:
    """Send a finished (done or failed) job to each tracker, once per result and destination."""
    if not (active := _active(config)):
        return
    from cprobe.job import read_status

    out_dir = Path(config.hydra.runtime.output_dir)
    status = read_status(out_dir)
    if not status or status.get("state") not in ("done", "failed"):
        return  # a config error removed the run dir, or another process owns the job
    sweep_dir = Path(config.hydra.sweep.dir) if _multirun(config) else None
    parents = (read_json(sweep_dir / TRACKERS_FILE) or {}) if sweep_dir is not None else {}
    logged = read_json(out_dir / TRACKERS_FILE) or {}
    job = None
    changed = False
    for t in active:
        dest = _destination(t)
        prev = logged.get(t.name) or {}
        if (prev.get("destination"), prev.get("started"), prev.get("state")) == \
                (dest, status.get("started"), status.get("state")):
            continue  # this result is in that tracker already (a rerun that skipped the finished job)
        if job is None:
            job = gather(config, out_dir, status, sweep_dir)
        ref = _guard(t, f"logging the job {job.run_name}", t.log_job, job, _parent(parents, t))
        if ref is not None:
            logged[t.name] = {"destination": dest, "started": status.get("started"), "state": status.get("state"),
                              **ref}
            changed = True
    if changed:
        write_json(out_dir / TRACKERS_FILE, logged, sort_keys=True)


def sweep_ended(config: Any, failed: Sequence[str] = ()) -> None:
    """Close each tracker's parent run with the sweep's report, tables, search summary and status."""
    if not (active := _active(config)):
        return
    from cprobe.trackers.base import SweepLog

    sweep_dir = Path(config.hydra.sweep.dir)
    parents = read_json(sweep_dir / TRACKERS_FILE) or {}
    name = str(config.get("name", "cprobe"))
    search = read_json(sweep_dir / "search.json") or None
    sweep = SweepLog(sweep_dir=sweep_dir, run_name=f"{name}/{sweep_dir.name}", experiment=name,
                     overrides=[str(o) for o in config.hydra.overrides.task], failed=list(failed), search=search)
    for t in active:
        if (parent := _parent(parents, t)) is not None:
            _guard(t, "closing the sweep's parent run", t.end_sweep, sweep, parent)


def sweep_discarded(config: Any) -> None:
    """Undo :func:`sweep_started` for a sweep refused before any job ran (an invalid search): the parent runs are
    deleted and the sweep root's ``trackers.json`` removed, so the directory can go."""
    sweep_dir = Path(config.hydra.sweep.dir)
    state = read_json(sweep_dir / TRACKERS_FILE) or {}
    if not state or not all(isinstance(v, dict) and "destination" in v for v in state.values()):
        return  # none, or not the file sweep_started writes ({tracker: {destination, ...}}): left alone
    for t in _active(config):
        if (parent := _parent(state, t)) is not None:
            _guard(t, "discarding the sweep's parent run", t.discard_sweep, parent)
    (sweep_dir / TRACKERS_FILE).unlink(missing_ok=True)
