"""Per-job plumbing shared by all tasks: output dir, resume marker, seeds, model reuse within a process."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cprobe.cache import ActivationCache

from cprobe.io import read_json, write_json

log = logging.getLogger(__name__)

FAILED: list[str] = []
"""Jobs of this process's sweep that failed or were skipped (the CLI exits non-zero when any is listed)."""

SHOWN_FAILED = 3
"""How many failed jobs the closing line of a run names (the rest are counted)."""


def failure_line(failed: Sequence[str], report_failed: Sequence[str]) -> str:
    """The closing line of a run whose jobs or aggregation failed: ``N job(s) failed: a; b; c; and M more``, then
    the aggregation's failure."""
    parts = []
    if failed:
        more = len(failed) - SHOWN_FAILED
        parts.append(f"{len(failed)} job(s) failed: " + "; ".join(failed[:SHOWN_FAILED])
                     + (f"; and {more} more (`cprobe status DIR` lists them)" if more > 0 else ""))
    return "; ".join(parts + list(report_failed[:1]))


STATUS = "status.json"

ATTEMPT_ENV = "CPROBE_ATTEMPT"
"""The attempt this process's jobs belong to (cprobe's SLURM launcher sets it in each array task: the submission's
token and the task's id); every ``status.json`` written here records it as ``attempt``, so a sweep's reader tells
this submission's states from what an earlier one left in the same directory (:mod:`cprobe.sweep`)."""


def seed_everything(seed: int) -> None:
    """Seeds python, numpy and torch (probe init, shuffles, splits, attacks all draw from these)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def config_hash(cfg: Mapping[str, Any]) -> str:
    """16 hex digits of the config (empty optional keys left out: :func:`cprobe.config.identity`)."""
    from cprobe.config import identity

    return hashlib.sha256(json.dumps(identity(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_status(out_dir: Path) -> dict[str, Any] | None:
    return read_json(out_dir / STATUS)


def write_status(out_dir: Path, **fields: Any) -> None:
    """Write a job's ``status.json``, with the attempt that wrote it (:data:`ATTEMPT_ENV`) where there is one."""
    attempt = os.environ.get(ATTEMPT_ENV)
    if attempt and "attempt" not in fields:
        fields["attempt"] = attempt
    write_json(out_dir / STATUS, fields)


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``): with the pid, it names one process
    even after the pid is reused. None where there is no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def this_process() -> dict[str, Any]:
    """What ``status.json`` records about the process running a job, to tell later whether it still runs."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "pid_start": _start_ticks(os.getpid())}


def process_gone(status: Mapping[str, Any]) -> bool:
    """True when ``status`` says ``running`` but its process is gone (killed with SIGKILL, out of memory, the
    machine rebooted). False when it may still run: alive here, or on another host (which cannot be checked)."""
    if status.get("state") != "running" or "pid" not in status or status.get("host") != socket.gethostname():
        return False
    pid = int(status["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    start = status.get("pid_start")
    return start is not None and _start_ticks(pid) not in (None, start)  # the pid now names another process


def describe_state(status: Mapping[str, Any]) -> str:
    """A job's state for people: ``done``, ``failed (why)``, ``running (pid 12 on host)``, or ``dead`` for a
    ``running`` job whose process is gone."""
    state = str(status.get("state", "unknown"))
    if process_gone(status):
        return f"dead (its process {status['pid']} on {status['host']} is gone, killed while running; rerun it)"
    if state == "running" and "pid" in status:
        return f"running (pid {status['pid']} on {status.get('host', '?')})"
    return state + (f" ({status['error']})" if status.get("error") else "")


_ADAPTER: dict[str, Any] = {}


@dataclass
class JobContext:
    """What a task needs besides its config: where to write, where data and caches live, what to warn about."""

    cfg: dict[str, Any]
    out_dir: Path
    data_root: Path
    cache_root: Path
    progress: bool = True
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What the job's models were: {name: {"weights", "dtype", "bos"}} (environment.json; quantised weights also
    name themselves in the records: :meth:`weights_column`)."""

    def cache_dir(self, kind: str) -> Path | None:
        """The directory of registered cache kind ``kind`` (:func:`cprobe.cache.kind_dir`), or None when the job's
        caches are off (``cache.enabled=false``: the one place that setting is read)."""
        from cprobe.cache import kind_dir

        return kind_dir(self.cache_root, kind) if (self.cfg.get("cache") or {}).get("enabled", True) else None

    @property
    def cache(self) -> ActivationCache:
        """The activation cache (imported here: reading status files, as `cprobe status` does, needs no torch)."""
        from cprobe.cache import ACTS, SHARD_MB, ActivationCache

        c = self.cfg.get("cache", {}) or {}
        return ActivationCache(self.cache_root, enabled=self.cache_dir(ACTS) is not None,
                               dtype=str(c.get("dtype", "float32")), shard_mb=float(c.get("shard_mb", SHARD_MB)))

    @property
    def seed(self) -> int:
        return int(self.cfg["seed"])

    @property
    def device(self) -> str | None:
        """The job's device for probes and estimators (None: follow the data)."""
        d = str(self.cfg.get("device", "auto"))
        return None if d == "auto" else d

    def warn(self, message: str) -> None:
        """A loud warning: logged now (once: a repeat is neither logged nor recorded again), and recorded in the
        job's tables and status.json."""
        if message in self.warnings:
            return
        log.warning(message)
        self.warnings.append(message)

    def dataset(self) -> Any:
        """The job's dataset (its ``dataset`` config, files under :attr:`data_root`), each of its notes warned."""
        from cprobe.data.registry import load_dataset

        data = load_dataset(self.cfg["dataset"], self.data_root)
        for note in getattr(data, "notes", ()):
            self.warn(note)
        return data

    def adapter(self, model_cfg: Mapping[str, Any]):
        """Load (or reuse, within this process) the model: consecutive sweep jobs share it.

        A job-level ``device`` (e.g. ``device=cuda``) also places a model whose own device is ``auto``. (The compute
        group's ``batch_size`` / ``batch_tokens`` reach a model through its config's interpolations.)
        """
        from cprobe.models.load import load_adapter

        device = str(self.cfg.get("device", "auto"))
        if device != "auto" and str(model_cfg.get("device", "auto")) == "auto":
            model_cfg = {**model_cfg, "device": device}
        key = json.dumps(model_cfg, sort_keys=True, default=str)
        if key not in _ADAPTER:
            _ADAPTER.clear()
            t0 = time.perf_counter()
            _ADAPTER[key] = load_adapter(model_cfg, self.cache_root, self.progress, self.data_root)
            self.timings["load_model_s"] = time.perf_counter() - t0
        from cprobe.compute import compute_flag

        ad = _ADAPTER[key]
        ad.resume = compute_flag(self.cfg.get("compute"), "resume")  # compute.resume=false: full forwards
        ad.kv_resume = compute_flag(self.cfg.get("compute"), "kv_resume")  # false: last-token passes, every token
        self.models[ad.name] = {"weights": ad.weights, "dtype": str(ad.dtype).removeprefix("torch."), "bos": ad.bos}
        return ad

    def weights_column(self) -> str | None:
        """The job's models whose weights are not plain checkpoint weights in their dtype (a GGUF's, dequantised):
        "name: how they were made" (the tables' ``model_weights`` column, so the records say so), or None."""
        made = [f"{n}: {m['weights']}" for n, m in sorted(self.models.items()) if m["weights"] != m["dtype"]]
        return "; ".join(made) or None

    def probe(self, probe_cfg: Mapping[str, Any]):
        """An unfitted probe from its config, with the job's seed and device."""
        from cprobe.probes import PROBES

        return PROBES.build(probe_cfg, seed=self.seed, device=self.device)


def quiet_workers() -> bool:
    """Progress bars off in parallel launcher workers (interleaved bars are noise)."""
    return os.environ.get("CPROBE_NO_PROGRESS", "") not in ("", "0")
