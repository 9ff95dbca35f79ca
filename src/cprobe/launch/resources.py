"""What a sweep asks SLURM for, fitted to the partition it goes to, and refused before submission when the partition
cannot give it.

- **GPUs** follow the job's device (``compute=``): 0 for ``cpu``, 1 for ``cuda`` (``compute=gpu``/``gpu_bf16``), and
  for ``auto`` 1 where the partition has GPUs, else 0. An explicit ``gpus_per_node`` wins, but a CUDA job with 0
  GPUs, or GPUs on a partition without any, is refused.
- **CPUs** ``auto``: up to 8 (the GPU's share of a node's CPUs for GPU jobs), never more than a node has.
- **Memory** ``auto``: the CPUs' share of a node's memory, at most 32 GB per GPU (or per CPU job).
- **Time**: ``timeout_min``, refused beyond the partition's limit.

Every refusal is one line naming the partition's nodes and the setting to change; then ``sbatch --test-only`` asks
the scheduler itself (accounts, QOS and limits cprobe does not read).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cprobe.errors import ConfigError
from cprobe.slurmctl import Partition

AUTO = "auto"
MAX_AUTO_CPUS = 8
MAX_AUTO_MEM_GB = 32.0
LOCAL_HINT = "hydra.launcher.partition=NAME on the command line, or `partition: NAME` in conf/local/slurm.yaml"


@dataclass(frozen=True)
class Request:
    """One array task's resources."""

    partition: str
    gpus: int
    cpus: int
    mem_gb: float
    minutes: int
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None

    def describe(self) -> str:
        gpu = f", {self.gpus} GPU(s)" if self.gpus else ""
        return (f"partition {self.partition}: {self.cpus} CPU(s), {self.mem_gb:g} GB{gpu}, {self.minutes} min per task"
                + (f", account {self.account}" if self.account else "") + (f", qos {self.qos}" if self.qos else ""))

    def sbatch_flags(self) -> dict[str, Any]:
        """The flags ``sbatch --test-only`` checks (as submitted)."""
        return {"partition": self.partition, "time": self.minutes, "cpus-per-task": self.cpus,
                "mem": f"{int(self.mem_gb * 1024)}M", "gpus-per-node": self.gpus or None, "account": self.account,
                "qos": self.qos, "constraint": self.constraint}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_auto(v: Any) -> bool:
    return v is None or str(v).strip().lower() == AUTO


def _int(name: str, v: Any, minimum: int, auto: bool = True) -> int:
    alt = " or auto" if auto else ""
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"hydra.launcher.{name}={v!r} must be an integer{alt}") from None
    if n < minimum:
        raise ConfigError(f"hydra.launcher.{name}={v!r} must be >= {minimum}{alt}")
    return n


def pick_partition(name: str | None, parts: Mapping[str, Partition]) -> Partition:
    if not parts:
        raise ConfigError("sinfo lists no partition: this user can submit nowhere on this cluster")
    if name:
        if name not in parts:
            raise ConfigError(f"unknown SLURM partition {name!r}; choose from {sorted(parts)} ({LOCAL_HINT})")
        p = parts[name]
    else:
        defaults = [p for p in parts.values() if p.default]
        if not defaults:
            raise ConfigError(f"this cluster has no default partition; pick one of {sorted(parts)} ({LOCAL_HINT})")
        p = defaults[0]
    if not p.up:
        raise ConfigError(f"SLURM partition {p.name!r} is not up (sinfo says so); pick another of {sorted(parts)} "
                          f"({LOCAL_HINT})")
    return p


def resolve(params: Mapping[str, Any], devices: Iterable[str], parts: Mapping[str, Partition]) -> Request:
    """The task request for a sweep whose jobs run on ``devices``; ConfigError, in one line, when the partition
    cannot satisfy it."""
    p = pick_partition(params.get("partition"), parts)
    devs = [str(d) for d in devices]  # some job needs CUDA; some job would use a GPU if it had one
    need_cuda, maybe = any(d.startswith("cuda") for d in devs), any(d == "auto" for d in devs)
    g = params.get("gpus_per_node")
    if _is_auto(g):
        gpus = 1 if need_cuda or (maybe and p.gpus > 0) else 0
    else:
        gpus = _int("gpus_per_node", g, 0)
        if need_cuda and gpus == 0:
            raise ConfigError("the jobs run on CUDA (compute=gpu / device=cuda) but hydra.launcher.gpus_per_node=0; "
                              "drop gpus_per_node (auto gives them one) or use compute=cpu")
    if gpus > p.gpus:
        gpu_parts = sorted(n for n, q in parts.items() if q.gpus >= max(gpus, 1))
        what = ("compute=gpu asks for a GPU" if need_cuda and _is_auto(g) else f"gpus_per_node={gpus} asks for "
                f"{gpus} GPU(s) per node")
        has = "has no GPUs" if p.gpus == 0 else f"has at most {p.gpus} per node"
        hint = (f"use compute=cpu, or a partition with GPUs: {gpu_parts} ({LOCAL_HINT})" if gpu_parts else
                "use compute=cpu (no partition of this cluster has GPUs)")
        raise ConfigError(f"{what} but SLURM partition {p.name!r} {has} ({p.describe()}); {hint}")
    hosts = [n for n in p.groups if n.gpus >= gpus] or p.groups
    node_cpus = max(n.cpus for n in hosts)
    c = params.get("cpus_per_task")
    if _is_auto(c):
        share = node_cpus if not gpus else max(1, node_cpus * gpus // max(1, max(n.gpus for n in hosts)))
        cpus = max(1, min(MAX_AUTO_CPUS * max(1, gpus), share))
    else:
        cpus = _int("cpus_per_task", c, 1)
    m = params.get("mem_gb")
    fitting = [n for n in hosts if n.cpus >= cpus] or hosts
    node_mem = max(n.mem_mb for n in fitting) / 1024
    if _is_auto(m):
        share = node_mem * cpus / max(1, max(n.cpus for n in fitting))
        mem = max(1.0, math.floor(min(share, MAX_AUTO_MEM_GB * max(1, gpus)) * 4) / 4)
    else:
        try:
            mem = float(m)
        except (TypeError, ValueError):
            raise ConfigError(f"hydra.launcher.mem_gb={m!r} must be a number of GB or auto") from None
        if mem <= 0:
            raise ConfigError(f"hydra.launcher.mem_gb={m!r} must be > 0 (or auto)")
    minutes = _int("timeout_min", params.get("timeout_min", 60), 1, auto=False)
    if p.max_minutes is not None and minutes > p.max_minutes:
        raise ConfigError(f"hydra.launcher.timeout_min={minutes} exceeds SLURM partition {p.name!r}'s time limit "
                          f"of {p.max_minutes} min; lower it (a packed task that runs out of time is requeued and "
                          "goes on where it stopped)")
    if cpus > max(n.cpus for n in hosts):
        raise ConfigError(f"hydra.launcher.cpus_per_task={cpus} but the largest node of SLURM partition {p.name!r} "
                          f"has {max(n.cpus for n in hosts)} CPUs ({p.describe()}); lower it (or leave it auto)")
    if mem > max(n.mem_mb for n in hosts) / 1024:
        raise ConfigError(f"hydra.launcher.mem_gb={mem:g} but the largest node of SLURM partition {p.name!r} has "
                          f"{max(n.mem_mb for n in hosts) / 1024:.1f} GB ({p.describe()}); lower it (or leave it "
                          "auto)")
    if not any(n.cpus >= cpus and n.mem_mb / 1024 >= mem and n.gpus >= gpus for n in p.groups):
        asked = f"{cpus} CPU(s), {mem:g} GB" + (f" and {gpus} GPU(s)" if gpus else "")
        raise ConfigError(f"no node of SLURM partition {p.name!r} has {asked} ({p.describe()}); lower "
                          "hydra.launcher.cpus_per_task / mem_gb (or leave them auto)")
    return Request(p.name, gpus, cpus, mem, minutes, params.get("account") or None, params.get("qos") or None,
                   params.get("constraint") or None)


def slots(req: Request, part: Partition, parallelism: int) -> int:
    """How many array tasks of ``req`` the partition runs at once (at most ``parallelism``)."""
    n = 0
    for g in part.groups:
        fit = [g.cpus // req.cpus, int(g.mem_mb / 1024 // req.mem_gb)]
        if req.gpus:
            fit.append(g.gpus // req.gpus)
        n += g.nodes * max(0, min(fit))
    return max(1, min(n, parallelism))
