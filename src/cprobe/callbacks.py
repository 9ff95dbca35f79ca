"""Hydra callbacks: a ``latest`` link to the newest run/sweep dir, sweep aggregation when a sweep ends, and
failed jobs — and a failed aggregation — noted for the CLI's exit code.

Hydra catches whatever a callback raises and only warns, so a sweep whose report crashed would exit 0: the callback
catches every error itself, logs it and records it in :data:`REPORT_FAILED`, and ``cprobe run`` exits 1 with it."""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from cprobe import ownership, trackers
from cprobe.errors import CprobeError, JobAborted
from cprobe.job import FAILED  # the list lives below the pipeline, which appends skipped jobs to it
from cprobe.ownership import Made

log = logging.getLogger("cprobe")

REPORT_FAILED: list[str] = []
DIRS: list[Path] = []
"""The run directory of each ``cprobe run`` (the sweep directory of each ``-m`` run) this process started, in order:
:func:`cprobe.run` returns the one its call added."""


def reset() -> None:
    FAILED.clear()
    REPORT_FAILED.clear()


def claim_dir(path: Path) -> Made:
    """Create ``path`` and return what was made; when it exists already (another run started in the same second),
    ``<path>_2``, ``<path>_3``, … — ``mkdir`` is atomic, so two processes never get the same directory."""
    made = ownership.record(path)  # before anything is created: which parents are new
    path = made.directory
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        candidate = path if i == 1 else path.with_name(f"{path.name}_{i}")
        try:
            candidate.mkdir()
            return Made(candidate, made.parents if i == 1 else ())
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _timestamped(node: Any, key: str) -> bool:
    """Whether ``node.key`` is a time-stamped default (``${now:...}``) rather than a directory the user chose
    (``hydra.run.dir=DIR`` reruns or resumes in DIR, so it is never renamed)."""
    from omegaconf import OmegaConf

    return "${now:" in str(OmegaConf.to_container(node, resolve=False).get(key, ""))


def _check_target(d: Path, setting: str) -> None:
    """:func:`cprobe.ownership.check_target`, its refusal carried past Hydra's callback runner (which turns an
    ``Exception`` into a warning) as :class:`JobAborted`."""
    try:
        ownership.check_target(d, setting)
    except CprobeError as e:
        raise JobAborted(e) from None


SLURM_LAUNCHER = "hydra_plugins.cprobe_launcher.slurm_launcher.SlurmLauncher"


def claim_sweep_dir(config: Any) -> Made:
    """Give the sweep a directory of its own (a time-stamped default gets ``_2``... when taken, and ``latest`` linked
    to it; a directory the user chose is used as it is: a re-run resumes it), pin it in the overrides every job is
    composed from, and note what was made (:data:`cprobe.ownership.MADE`) for :func:`release_sweep_dir`."""
    from omegaconf import read_write

    sweep_dir = Path(config.hydra.sweep.dir)
    if _timestamped(config.hydra.sweep, "dir"):
        made = claim_dir(sweep_dir)
        claimed = str(made.directory)
        with read_write(config.hydra):
            config.hydra.sweep.dir = claimed
            # each job's config is composed again from these overrides: pin the claimed directory there
            config.hydra.overrides.hydra.append("hydra.sweep.dir='" + claimed.replace("'", "\\'") + "'")
        ownership.link_latest(made)
    else:
        made = ownership.record(sweep_dir)  # the launcher creates it
    ownership.MADE[made.directory] = made
    return made


def release_sweep_dir(made: Made) -> None:
    """Undo :func:`claim_sweep_dir` for a sweep nothing was submitted to: what this process made goes (never what was
    there before), and ``latest`` points back where it was."""
    ownership.MADE.pop(made.directory, None)
    ownership.undo(made)


class AggregateResults(Callback):
    """Gives every run (or sweep) a directory of its own and links ``latest`` to it; on multirun end (in the
    parent, for every launcher) aggregates the sweep."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        from omegaconf import read_write

        trackers.preflight(config)  # a bad logger is refused before the run dir exists
        if os.environ.get("CPROBE_DETACH", "") not in ("", "0"):
            raise JobAborted(CprobeError("--detach needs a sweep on SLURM: `cprobe run -m ... hydra/launcher=slurm "
                                         "--detach`"))
        if _timestamped(config.hydra.run, "dir"):
            made = claim_dir(Path(config.hydra.run.dir))
            with read_write(config.hydra.run):
                config.hydra.run.dir = str(made.directory)
            ownership.link_latest(made)
        else:  # a directory the user chose: new, empty or an earlier cprobe run's; Hydra creates it
            _check_target(Path(config.hydra.run.dir), "hydra.run.dir")
            made = ownership.record(Path(config.hydra.run.dir))
        ownership.MADE[made.directory] = made  # a refused config removes only this (cprobe.pipeline)
        DIRS.append(made.directory)

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        ownership.MADE.pop(ownership.key(config.hydra.run.dir), None)

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        trackers.preflight(config)  # a bad logger is refused before the sweep dir exists
        # cprobe's SLURM launcher claims the sweep dir itself, after checking the submission (a refused submission
        # leaves no directory and does not move ``latest``)
        slurm = str(OmegaConf.select(config, "hydra.launcher._target_", default="")) == SLURM_LAUNCHER
        if os.environ.get("CPROBE_DETACH", "") not in ("", "0") and not slurm:
            raise JobAborted(CprobeError("--detach needs hydra/launcher=slurm (a local sweep runs in this process)"))
        if not _timestamped(config.hydra.sweep, "dir"):  # refused before any launcher writes there
            _check_target(Path(config.hydra.sweep.dir), "hydra.sweep.dir")
        if not slurm:  # the SLURM launcher claims it after checking the request against the cluster
            claim_sweep_dir(config)
            trackers.sweep_started(config)  # the trackers' parent runs (never raises)

    def on_job_end(self, config: Any, job_return: Any = None, **kwargs: Any) -> None:
        """Wherever the job ran (this process, a joblib worker, a SLURM node): send it to the trackers, after its
        local files are complete (never raises)."""
        trackers.job_ended(config, job_return)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from cprobe import sweep as S
        from cprobe.outputs import collect

        sweep_dir = Path(config.hydra.sweep.dir)
        DIRS.append(sweep_dir.absolute())  # here, not at the start: the SLURM launcher claims its directory late
        ownership.MADE.pop(ownership.key(sweep_dir), None)  # started: nothing of it is undone any more
        if S.detached(sweep_dir):  # nothing has run yet: `cprobe collect` aggregates later
            return
        state = S.sweep_state(sweep_dir)
        FAILED.extend(state.problems())
        if not any(p.state == "done" for p in state.points) and not any(sweep_dir.rglob("status.json")):
            REPORT_FAILED.append(f"no job of the sweep ran (nothing under {sweep_dir})")
            return
        try:
            out = collect(sweep_dir, partial=True)
            log.info("sweep report: %s", out.report)
        except Exception as e:  # Hydra would swallow it: record it for the exit code
            msg = "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
            if not isinstance(e, CprobeError):
                msg = f"{type(e).__name__}: {msg}"
                log.debug("sweep aggregation failed", exc_info=True)
            if not FAILED or "no finished job" not in msg:  # all jobs failed: that is the error already
                REPORT_FAILED.append(f"the sweep's report failed: {msg} (rerun `cprobe collect {sweep_dir}` with "
                                     "CPROBE_DEBUG=1 for the traceback)")
            log.error("could not aggregate the sweep: %s", msg)
        finally:
            trackers.sweep_ended(config, failed=[*FAILED, *REPORT_FAILED])
