"""A sweep read back: which points it has, and what state each is in.

A SLURM sweep keeps, beside its points' directories, ``.slurm/``::

    sweep.json            the manifest: every point (its directory and overrides) and every submission (array job
                          id, which points each array task runs, the resources asked for, detached or not)
    tasks/<task>.json     each array task's own record: its points' outcomes (a point that failed before its
                          directory existed, inside Hydra, is only here), restarts, start-up time
    <job id>/             submitit's sbatch script, pickles and the tasks' stdout/stderr logs

A point's state comes from its ``status.json`` (written by the job), its task's record and the scheduler
(``squeue``/``sacct`` via :mod:`cprobe.slurmctl`): ``done``, ``failed``, ``running``, ``queued`` (its task is
pending, or has not reached it yet), ``interrupted`` (stopped by a signal; ``queued`` again when its task was
requeued), ``dead`` (``status.json`` says running but its task has ended) and ``not run`` (its task ended before
reaching it). A sweep without a manifest (a local one) has only its ``status.json`` files.

Only the newest attempt at a point counts. Each submission has a token; its array tasks run their points with
``attempt = <token>:<task>`` (:func:`attempt_id`, :data:`cprobe.job.ATTEMPT_ENV`), which every ``status.json`` and
task record they write carries. A point's ``status.json`` or record from another attempt (an earlier submission's
failure, say, in a re-run's directory) says nothing about the newest one: the point is then as its task is (queued,
or not run when the task ended without reaching it). A point done earlier with the same config is not submitted
again, so its newest attempt is the one that finished it.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cprobe.io import read_json, write_json
from cprobe.job import STATUS, describe_state, read_status
from cprobe.paths import relative

log = logging.getLogger("cprobe")

SLURM_DIR = ".slurm"
SWEEP_MANIFEST = "sweep.json"
TASKS = "tasks"

TERMINAL = ("done", "failed", "dead", "not run", "interrupted")
"""States in which nothing will happen to a point without a re-run."""
NEEDS_ACTION = ("failed", "dead", "not run", "interrupted", "not started")


def manifest_path(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / SLURM_DIR / SWEEP_MANIFEST


def read_manifest(sweep_dir: Path) -> dict[str, Any] | None:
    m = read_json(manifest_path(sweep_dir))
    return m if m is not None and "points" in m else None


def write_manifest(sweep_dir: Path, manifest: Mapping[str, Any]) -> None:
    write_json(manifest_path(sweep_dir), manifest)


def record_path(sweep_dir: Path, task: str) -> Path:
    return Path(sweep_dir) / SLURM_DIR / TASKS / f"{task}.json"


def read_record(sweep_dir: Path, task: str) -> dict[str, Any]:
    return read_json(record_path(sweep_dir, task)) or {}


def write_record(sweep_dir: Path, task: str, record: Mapping[str, Any]) -> None:
    write_json(record_path(sweep_dir, task), {**record, "updated": time.time()})


def attempt_id(token: str, task: str) -> str:
    """The attempt of array task ``task`` of the submission with ``token``: what its ``status.json`` files and its
    record say they were written by."""
    return f"{token}:{task}"


def latest_task(manifest: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """{point name: (array task id, job id)} of the newest submission that included each point."""
    return {name: (task, str(sub.get("job_id"))) for sub in manifest.get("submissions", [])
            for task, names in sub.get("tasks", {}).items() for name in names}


def latest_attempt(manifest: Mapping[str, Any]) -> dict[str, str | None]:
    """{point name: its newest attempt (:func:`attempt_id`)}; None for a submission without a token (written by a
    cprobe before attempts were recorded: its files are read as they are)."""
    return {name: attempt_id(str(sub["token"]), task) if sub.get("token") else None
            for sub in manifest.get("submissions", []) for task, names in sub.get("tasks", {}).items()
            for name in names}


def job_ids(manifest: Mapping[str, Any], names: Iterable[str] | None = None) -> list[str]:
    """The array job ids that hold ``names`` (all points when None) in their newest submission."""
    lt = latest_task(manifest)
    wanted = lt.keys() if names is None else [n for n in names if n in lt]
    return sorted({lt[n][1] for n in wanted})


# ----------------------------------------------------------------------------------------------- point states
@dataclass
class PointState:
    name: str
    state: str  # done | failed | running | queued | interrupted | dead | not run | not started
    detail: str = ""
    task: str = ""

    def problem(self) -> str:
        """``name: error`` for a failed point, ``name: state (why)`` otherwise."""
        if self.state == "failed" and self.detail:
            return f"{self.name}: {self.detail}"
        return f"{self.name}: {self.state}" + (f" ({self.detail})" if self.detail else "")

    def line(self) -> str:
        where = f"  [task {self.task}]" if self.task else ""
        return f"{self.state:<12} {self.name}" + (f": {self.detail}" if self.detail else "") + where


@dataclass
class SweepState:
    directory: Path
    points: list[PointState] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    scheduler: bool = False  # whether the scheduler was asked
    note: str = ""  # why it was not
    tasks: dict[str, Any] = field(default_factory=dict)  # task -> TaskState

    def counts(self) -> Counter:
        return Counter(p.state for p in self.points)

    def summary(self) -> str:
        c = self.counts()
        order = ["done", "running", "queued", "failed", "interrupted", "dead", "not run", "not started"]
        parts = [f"{c[s]} {s}" for s in order if c.get(s)]
        return f"{len(self.points)} point(s): " + ", ".join(parts)

    def problems(self) -> list[str]:
        """One short description per point that is not done."""
        return [p.problem() for p in self.points if p.state != "done"]


def _status_state(status: Mapping[str, Any] | None) -> tuple[str, str]:
    if status is None:
        return "not started", ""
    state = str(status.get("state", "unknown"))
    if state == "done":
        return "done", ""
    if state == "failed":
        return "failed", str(status.get("error", ""))
    if state == "interrupted":
        return "interrupted", f"by {status.get('signal', 'a signal')}"
    text = describe_state(status)
    if text.startswith("dead"):
        return "dead", text[len("dead"):].strip(" ()")
    if state == "running":
        return "running", f"pid {status.get('pid')} on {status.get('host')}" if "pid" in status else ""
    return state, ""


def sweep_state(sweep_dir: Path, scheduler: bool | None = None, task_states: Mapping[str, Any] | None = None
                ) -> SweepState:
    """Every point's state. ``scheduler``: ask SLURM about the tasks (default: when the sweep has a manifest and
    the SLURM commands are here); ``task_states`` gives them instead (the driver's own poll)."""
    from cprobe import slurmctl

    sweep_dir = Path(sweep_dir)
    manifest = read_manifest(sweep_dir)
    out = SweepState(sweep_dir)
    if manifest is None:
        for status in sorted(sweep_dir.rglob(STATUS)):
            if SLURM_DIR in status.relative_to(sweep_dir).parts:
                continue
            state, detail = _status_state(read_status(status.parent))
            out.points.append(PointState(relative(status.parent, sweep_dir), state, detail))
        return out
    lt = latest_task(manifest)
    attempts = latest_attempt(manifest)
    out.jobs = job_ids(manifest)
    records = {task: read_record(sweep_dir, task) for task, _ in set(lt.values())}

    def points(states: Mapping[str, Any] | None) -> list[PointState]:
        pts = []
        for name in manifest["points"]:
            task, attempt = lt.get(name, ("", ""))[0], attempts.get(name)
            rec = records.get(task, {})
            if attempt is not None and rec.get("attempt") != attempt:
                rec = {}  # another submission's task of the same id (job ids restart with a new cluster)
            pts.append(_point_state(sweep_dir, name, task, attempt, rec, states))
        return pts

    if task_states is None:
        out.points = points(None)
        if all(p.state in ("done", "failed") for p in out.points):  # nothing the scheduler could add
            return out
        use = slurmctl.available() if scheduler is None else scheduler
        if not use:
            out.note = "the scheduler was not asked: no SLURM commands here"
            return out
        try:
            task_states = slurmctl.states(out.jobs)
        except slurmctl.SchedulerError as e:
            out.note = f"the scheduler was not asked: {e}"
            return out
    out.scheduler = True
    out.tasks = dict(task_states)
    out.points = points(task_states)
    return out


def _point_state(sweep_dir: Path, name: str, task: str, attempt: str | None, rec: Mapping[str, Any],
                 task_states: Mapping[str, Any] | None) -> PointState:
    status = read_status(sweep_dir / name)
    if attempt is not None and status is not None and status.get("attempt") != attempt:
        status = None  # an earlier attempt's: the newest has not reached the point (or has not written it yet)
    state, detail = _status_state(status)
    mine = (rec.get("points") or {}).get(name, {})
    if state == "done" or (status is None and mine.get("state") == "done"):  # done: by its job, or found done
        return PointState(name, "done", "", task)
    if state == "failed":
        return PointState(name, "failed", detail, task)
    if mine.get("state") == "failed" and (status is None or status.get("state") != "running"):
        return PointState(name, "failed", str(mine.get("error", "")), task)
    if not task:
        return PointState(name, state, detail)
    ts = (task_states or {}).get(task)
    if task_states is None:  # no scheduler: the files alone
        if state == "not started" and rec.get("state") in ("done", "interrupted", "failed"):
            return PointState(name, "not run", f"task {task} ended ({rec.get('state')}) before it", task)
        return PointState(name, state, detail, task)
    if ts is not None and ts.alive:
        if ts.state == "RUNNING" and state == "running":
            return PointState(name, "running", detail, task)
        why = ts.describe() if ts.state != "RUNNING" else "its task runs and has not reached it yet"
        if state == "interrupted":
            restarts = rec.get("restarts", 0)
            why = f"interrupted {detail}, requeued" + (f" ({restarts} restart(s))" if restarts else "") + \
                  f"; task {ts.describe()}"
        return PointState(name, "queued", why, task)
    ended = f"task {task} {ts.describe()}" if ts is not None else f"task {task} has ended (the scheduler no " \
                                                                    "longer knows it)"
    if state == "running":
        return PointState(name, "dead", f"{ended} while it ran", task)
    if state == "interrupted":
        return PointState(name, "interrupted", f"{detail}; {ended}", task)
    return PointState(name, "not run", f"{ended} before it started", task)


def problems(sweep_dir: Path, scheduler: bool | None = None) -> list[str]:
    """What is not done in a sweep, one entry per point (``cprobe collect`` names them; the driver's exit code)."""
    return sweep_state(sweep_dir, scheduler=scheduler).problems()


def manifest_problems(directory: Path) -> tuple[dict[Path, bool], list[str]]:
    """({every point dir of the SLURM sweeps below ``directory``: whether it is done}, the problems of those not
    done): ``cprobe collect`` takes the sweeps' word for their points — a point that never started, or failed inside
    Hydra before its directory existed, has no ``status.json`` to find, and one whose ``status.json`` is an earlier
    attempt's is not done by it."""
    directory = Path(directory)
    covered: dict[Path, bool] = {}
    out: list[str] = []
    roots = [directory] if manifest_path(directory).is_file() else \
        [m.parent.parent for m in sorted(directory.rglob(f"{SLURM_DIR}/{SWEEP_MANIFEST}"))]
    for sweep_dir in roots:
        for p in sweep_state(sweep_dir).points:
            covered[(sweep_dir / p.name).resolve()] = p.state == "done"
            if p.state != "done":
                out.append(PointState(relative(sweep_dir / p.name, directory), p.state, p.detail, p.task).problem())
    return covered, out


def detached(sweep_dir: Path) -> bool:
    """Whether the newest submission of the sweep returned right after submitting (nothing to aggregate yet)."""
    m = read_manifest(sweep_dir)
    subs = (m or {}).get("submissions") or []
    return bool(subs and subs[-1].get("detached") and subs[-1].get("pid") == os.getpid())
