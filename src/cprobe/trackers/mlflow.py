"""MLflow (``logger=mlflow``; ``pip install 'cprobe[mlflow]'``): one run per job, a parent run per sweep.

The tracking URI comes from the config (``logger.mlflow.tracking_uri``): by default a local SQLite store in the output
root (``sqlite:///outputs/mlflow.db``, artifacts beside it in ``outputs/mlartifacts``; ``mlflow ui --backend-store-uri
sqlite:///outputs/mlflow.db`` browses it), or any server (``http://host:5000``), which works the same. MLflow 3
keeps the old ``./mlruns`` file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true``;
a ``file:`` URI is passed through as given.

A job's run: params = the resolved config (dotted keys), metrics = every record (:func:`cprobe.trackers.base.points`:
key from the record's fields, step = layer), tags = the fields its records share + state/run dir/error, artifacts =
figures, ``report.html``, ``records.parquet``, ``metrics.csv``, ``leaderboard.md``; status FINISHED or FAILED. A
sweep's parent run holds the sweep's overrides, its report and tables, and for an hparams search the objective per
trial (step = trial number) and the winner (``best.*`` tags); children carry ``mlflow.parentRunId``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cprobe.trackers.base import JobLog, SweepLog, Tracker, clean_key

log = logging.getLogger("cprobe")

MAX_PARAMS = 100  # MLflow's limits per log_batch call
MAX_METRICS = 1000
MAX_PARAM_LEN = 6000


@dataclass(frozen=True)
class Options:
    tracking_uri: str = "sqlite:///outputs/mlflow.db"
    experiment: str = "cprobe"  # the MLflow experiment (created if missing); the configs set it to the config's name
    artifact_location: str | None = None  # a new experiment's artifact root; null: beside a local store, else the
    # server's
    http_retries: int = 2  # MLFLOW_HTTP_REQUEST_MAX_RETRIES when unset: how long a gone server is retried
    http_timeout: int = 20  # MLFLOW_HTTP_REQUEST_TIMEOUT (s) when unset

    def __post_init__(self) -> None:
        if not self.tracking_uri:
            raise ValueError("tracking_uri must not be empty")
        if self.http_retries < 0 or self.http_timeout < 1:
            raise ValueError("http_retries must be >= 0 and http_timeout >= 1")


def _local_root(uri: str) -> Path | None:
    """The directory of a local store (``sqlite:///path.db``, ``file:///dir``, a plain path), else None."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):]).parent
    if uri.startswith("file:"):
        from urllib.parse import urlparse

        return Path(urlparse(uri).path)
    if "://" not in uri and ":" not in uri.split("/")[0]:
        return Path(uri)
    return None


class MLflowTracker(Tracker):
    name = "mlflow"
    Options = Options

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self._client: Any = None

    def destination(self) -> str:
        return f"{self.options.tracking_uri}#{self.options.experiment}"

    # -------------------------------------------------------------------------------------------- plumbing
    def client(self) -> Any:
        if self._client is None:
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(self.options.http_retries))
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(self.options.http_timeout))
            root = _local_root(self.options.tracking_uri)
            if root is not None:
                root.mkdir(parents=True, exist_ok=True)
            from mlflow.tracking import MlflowClient

            for name in ("mlflow", "alembic"):  # store migrations and the like: INFO noise in the job log (mlflow
                logging.getLogger(name).setLevel(logging.WARNING)  # sets its level when imported: after that)

            self._client = MlflowClient(tracking_uri=self.options.tracking_uri)
        return self._client

    def experiment_id(self) -> str:
        c = self.client()
        name = self.options.experiment
        exp = c.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        location = self.options.artifact_location
        root = _local_root(self.options.tracking_uri)
        if location is None and root is not None:
            location = str((root / "mlartifacts").resolve())
        try:
            return c.create_experiment(name, artifact_location=location)
        except Exception:  # created meanwhile by a parallel job
            exp = c.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def _batch(self, run_id: str, params: Mapping[str, str] = {}, metrics: Sequence[Any] = (),
               tags: Mapping[str, str] = {}) -> None:
        from mlflow.entities import Param, RunTag

        c = self.client()
        ps = [Param(clean_key(k)[:250], str(v)[:MAX_PARAM_LEN]) for k, v in params.items()]
        ts = [RunTag(clean_key(k)[:250], str(v)[:8000]) for k, v in tags.items()]
        for kw, items, size in (("params", ps, MAX_PARAMS), ("tags", ts, MAX_PARAMS),
                                ("metrics", list(metrics), MAX_METRICS)):
            for i in range(0, len(items), size):
                c.log_batch(run_id, **{kw: items[i:i + size]})

    def _artifacts(self, run_id: str, root: Path, files: Sequence[Path]) -> None:
        c = self.client()
        for f in files:
            rel = f.parent.relative_to(root) if f.parent != root else None
            c.log_artifact(run_id, str(f), artifact_path=str(rel) if rel else None)

    # -------------------------------------------------------------------------------------------- runs
    def start_sweep(self, sweep_dir: Path, run_name: str, experiment: str, overrides: Sequence[str]) -> dict:
        c = self.client()
        exp = self.experiment_id()
        run = c.create_run(exp, run_name=run_name, tags={"cprobe.kind": "sweep", "cprobe.sweep_dir": str(sweep_dir)})
        self._batch(run.info.run_id, params={"overrides": " ".join(overrides) or "(none)"})
        return {"run_id": run.info.run_id, "experiment_id": exp}

    def log_job(self, job: JobLog, parent: Mapping[str, Any] | None) -> dict:
        from mlflow.entities import Metric

        c = self.client()
        exp = parent["experiment_id"] if parent else self.experiment_id()
        tags = {"cprobe.kind": "job", **job.tags}
        if parent:
            tags["mlflow.parentRunId"] = parent["run_id"]
        run = c.create_run(exp, run_name=job.run_name, tags=tags,
                           start_time=int(1000 * float(job.status.get("started") or time.time())))
        rid = run.info.run_id
        try:
            now = int(time.time() * 1000)
            self._batch(rid, params=job.params,
                        metrics=[Metric(p.key, p.value, now, p.step) for p in job.points])
            self._artifacts(rid, job.out_dir, job.artifacts)
        except BaseException:
            c.set_terminated(rid, "FAILED")
            raise
        end = job.status.get("started")
        end_ms = int(1000 * (float(end) + float(job.status.get("duration_s") or 0))) if end else None
        c.set_terminated(rid, "FINISHED" if job.ok else "FAILED", end_time=end_ms)
        return {"run_id": rid, "experiment_id": exp}

    def end_sweep(self, sweep: SweepLog, parent: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        c = self.client()
        rid = parent["run_id"]
        now = int(time.time() * 1000)
        tags = {"cprobe.state": "done" if sweep.ok else "failed"}
        if sweep.failed:
            tags["cprobe.failed"] = "; ".join(sweep.failed)[:8000]
        metrics = []
        s = sweep.search
        if s:
            key = clean_key(f"search/{s['metric']}")
            metrics = [Metric(key, v, now, n) for n, v in sweep.search_points()]
            best = s.get("best") or {}
            if best:
                metrics.append(Metric(clean_key(f"best/{s['metric']}"), float(best["value"]), now, 0))
                tags.update({"best.trial": str(best["number"]), "best.params": str(best["params"]),
                             "best.job": str(best.get("job", "")), "best.why": str(s.get("why", ""))[:8000]})
        self._batch(rid, metrics=metrics, tags=tags)
        self._artifacts(rid, sweep.sweep_dir, sweep.artifacts)
        c.set_terminated(rid, "FINISHED" if sweep.ok else "FAILED")

    def discard_sweep(self, parent: Mapping[str, Any]) -> None:
        self.client().delete_run(parent["run_id"])
