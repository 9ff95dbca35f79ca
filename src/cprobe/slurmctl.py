"""The SLURM commands cprobe runs, parsed: partitions (``sinfo``), task states (``squeue``, then ``sacct`` where the
cluster keeps accounting), one job's details (``scontrol show job``), a dry submission (``sbatch --test-only``) and a
requeue. Every command has a timeout; a command that fails logs its message once per process (a cluster without
accounting answers every ``sacct`` with the same warning), never once per poll.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cprobe.errors import CprobeError

log = logging.getLogger("cprobe")

TIMEOUT_S = 30

ALIVE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                   "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "PREEMPTED"})
"""Scheduler states of a task that may still run (a PREEMPTED task is requeued or cancelled next)."""

_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Log a scheduler warning the first time this process sees it."""
    key = re.sub(r"\d+", "#", message)  # "job 123" and "job 124" are the same warning
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(message)


class SchedulerError(CprobeError):
    """A SLURM command is missing or failed."""


def available() -> bool:
    """Whether the SLURM client commands are on PATH."""
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


def run(argv: Sequence[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a SLURM command; SchedulerError when it is not installed or hangs."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "SLURM_TIME_FORMAT": "standard"})
    except FileNotFoundError:
        raise SchedulerError(f"`{argv[0]}` not found: hydra/launcher=slurm needs the SLURM client commands on PATH "
                             "(run on a cluster's login node)") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"`{' '.join(argv[:2])}` did not answer in {timeout:.0f} s: is slurmctld up? "
                             "(`sinfo` on this node should answer)") from None


def clean(message: str) -> str:
    """An ``sbatch: error: ...`` line without the command prefixes."""
    lines = [re.sub(r"^(sbatch|srun|squeue|sinfo|scontrol|sacct|allocation failure):\s*(error:\s*)?", "", l.strip())
             for l in message.splitlines() if l.strip()]
    return "; ".join(dict.fromkeys(l for l in lines if l))


# ----------------------------------------------------------------------------------------------- partitions
def parse_minutes(text: str) -> int | None:
    """A SLURM time (``infinite``, ``1-00:00:00``, ``4:00:00``, ``30:00`` = 30 min, ``45`` = 45 min) in minutes;
    None for no limit."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited", "n/a", "none", ""):
        return None
    d, sep, rest = text.partition("-")
    days, text = (int(d), rest) if sep else (0, text)
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, (m, s) = 0, parts
    else:
        h, m, s = 0, parts[0], 0
    return days * 1440 + h * 60 + m + (1 if s else 0)


def parse_gpus(gres: str) -> int:
    """GPUs per node in an ``sinfo %G`` field: ``(null)`` → 0, ``gpu:4`` → 4, ``gpu:a100:4(S:0-1)`` → 4."""
    items = [re.sub(r"\(.*?\)", "", item.strip()) for item in gres.split(",")]
    tails = [item.split(":")[-1] for item in items if item.startswith("gpu")]
    return sum(int(tail) if tail.isdigit() else 1 for tail in tails)


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of a partition alike in CPUs, memory and GPUs (one ``sinfo`` line)."""

    nodes: int
    cpus: int
    mem_mb: int
    gpus: int


@dataclass
class Partition:
    name: str
    default: bool = False
    up: bool = True
    max_minutes: int | None = None
    groups: list[NodeGroup] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        """The most GPUs on one node."""
        return max((g.gpus for g in self.groups), default=0)

    @property
    def cpus(self) -> int:
        return max((g.cpus for g in self.groups), default=0)

    @property
    def mem_mb(self) -> int:
        return max((g.mem_mb for g in self.groups), default=0)

    def describe(self) -> str:
        parts = [f"{g.nodes} node(s) of {g.cpus} CPUs, {g.mem_mb / 1024:.0f} GB, "
                 + (f"{g.gpus} GPU(s)" if g.gpus else "no GPUs") for g in self.groups]
        limit = "no time limit" if self.max_minutes is None else f"time limit {self.max_minutes} min"
        return "; ".join(parts) + f"; {limit}"


def partitions() -> dict[str, Partition]:
    """Every partition this user sees, from ``sinfo`` (one line per partition and kind of node)."""
    r = run(["sinfo", "-h", "-o", "%P|%a|%l|%D|%c|%m|%G"])
    if r.returncode != 0:
        raise SchedulerError(f"sinfo failed: {clean(r.stderr) or r.returncode} (is this a SLURM cluster's login "
                             "node? is slurmctld up?)")
    return parse_partitions(r.stdout)


def parse_partitions(text: str) -> dict[str, Partition]:
    out: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 7:
            continue
        name, avail, limit, nodes, cpus, mem, gres = fields[:7]
        default = name.endswith("*")
        name = name.rstrip("*")
        p = out.setdefault(name, Partition(name, default=default, up=avail.strip().lower() == "up",
                                            max_minutes=parse_minutes(limit)))
        p.default = p.default or default
        try:
            p.groups.append(NodeGroup(int(nodes), int(re.sub(r"\D.*", "", cpus) or 0),
                                      int(re.sub(r"\D.*", "", mem) or 0), parse_gpus(gres)))
        except ValueError:
            continue
    return out


# ----------------------------------------------------------------------------------------------- task states
@dataclass(frozen=True)
class TaskState:
    """What the scheduler says about one array task (or a plain job)."""

    state: str
    reason: str = ""
    source: str = "squeue"

    @property
    def alive(self) -> bool:
        return self.state.split()[0] in ALIVE

    def describe(self) -> str:
        why = f" ({self.reason})" if self.reason and self.reason not in ("None", "(null)") else ""
        return f"{self.state}{why}"


_NO_SACCT = False


def states(job_ids: Iterable[str]) -> dict[str, TaskState]:
    """{``<array job>_<task>`` or ``<job>``: state} for every task of ``job_ids`` the scheduler still knows:
    ``squeue`` (live tasks, and finished ones for a few minutes), then ``sacct`` for those it has forgotten where the
    cluster keeps accounting. A task neither knows is absent (vanished). SchedulerError when squeue cannot answer
    (no cluster here, slurmctld down): absent would then be a lie."""
    ids = sorted(set(job_ids))
    out: dict[str, TaskState] = {}
    for jid in ids:  # one query per job: squeue fails as a whole when one of several ids is unknown
        r = run(["squeue", "-h", "-r", "-t", "all", "-j", jid, "-o", "%i|%T|%r"])
        if r.returncode != 0:
            msg = clean(r.stderr)
            if "invalid job id" not in msg.lower():  # not a cluster, slurmctld down: nothing can be said
                raise SchedulerError(f"squeue failed: {msg or f'exit {r.returncode}'}")
            continue
        for line in r.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 2:
                out[parts[0]] = TaskState(parts[1], parts[2] if len(parts) > 2 else "")
    missing = [j for j in ids if not any(k == j or k.startswith(f"{j}_") for k in out)]
    if missing:
        out.update({k: v for k, v in accounting(missing).items() if k not in out})
    return out


def accounting(job_ids: Sequence[str]) -> dict[str, TaskState]:
    """States from ``sacct`` (finished tasks squeue has forgotten); {} where accounting is off (said once)."""
    global _NO_SACCT
    if _NO_SACCT or not shutil.which("sacct"):
        return {}
    r = run(["sacct", "-n", "-P", "-X", "-o", "JobID,State,Reason", *[f"-j{j}" for j in job_ids]])
    if r.returncode != 0 or "accounting storage is disabled" in (r.stdout + r.stderr).lower():
        _NO_SACCT = True
        msg = clean(r.stderr + r.stdout) or f"exit {r.returncode}"
        warn_once(f"sacct is not available on this cluster ({msg}): finished tasks are read from squeue while it "
                  "remembers them, then from the points' status.json")
        return {}
    out = {}
    for line in r.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and "." not in parts[0] and "[" not in parts[0]:
            out[parts[0]] = TaskState(parts[1].split()[0], parts[2] if len(parts) > 2 else "", "sacct")
    return out


def job_info(job_id: str) -> dict[str, str]:
    """``scontrol show job -o`` as a dict ({} when the job is unknown or the scheduler does not answer)."""
    try:
        r = run(["scontrol", "show", "job", "-o", job_id], timeout=10)
    except SchedulerError:
        return {}
    if r.returncode != 0:
        return {}
    out = {}
    for token in r.stdout.split():
        k, sep, v = token.partition("=")
        if sep:
            out.setdefault(k, v)
    return out


def requeue(job_id: str) -> str | None:
    """``scontrol requeue JOB``; None on success, else the error (never raises: the caller is a task on its way
    out, which must still record why it was not requeued)."""
    try:
        r = run(["scontrol", "requeue", job_id], timeout=60)
    except SchedulerError as e:
        return str(e)
    return None if r.returncode == 0 else (clean(r.stderr) or f"exit {r.returncode}")


def test_submit(flags: Mapping[str, object]) -> str | None:
    """``sbatch --test-only`` with the given ``--flag=value`` pairs: None when the scheduler would accept the job,
    else its error, in one line."""
    argv = ["sbatch", "--test-only", "--wrap=true"]
    for k, v in flags.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        argv.append(flag if v is True else f"{flag}={v}")
    r = run(argv)
    if r.returncode == 0:
        return None
    return clean(r.stderr + r.stdout) or f"sbatch --test-only exited {r.returncode}"
