"""Experiment trackers: the ``logger=`` config group and what the Hydra callback calls (:mod:`.lifecycle`); one
module per tracker behind :mod:`.base`."""

from cprobe.trackers.lifecycle import (LOCAL, LOGGERS, TRACKERS_FILE, LoggerSpec, check, gather, job_ended, preflight,
                                       sweep_discarded, sweep_ended, sweep_started, trackers)

__all__ = ["LOCAL", "LOGGERS", "TRACKERS_FILE", "LoggerSpec", "check", "gather", "job_ended", "preflight",
           "sweep_discarded", "sweep_ended", "sweep_started", "trackers"]
