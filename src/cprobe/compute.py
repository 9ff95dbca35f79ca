"""The hardware a job runs on: native bf16 on this CPU, how many threads fit, which GPU a parallel worker takes.

- :func:`cpu_bf16` — whether this CPU computes bf16 natively (x86 AVX512-BF16 or AMX, ARM BF16), from the CPU's
  flags, else a timed probe (≤ 1 s, once per process). On AVX2-only CPUs a bf16 matmul is ~90× slower than fp32, so
  :func:`resolve_dtype` / :func:`use_bf16` fall back to fp32 there with one log line (``CPROBE_CPU_BF16=1|0``
  overrides the detection).
- The thread policy (docs/performance.md, "A shared CPU"): OpenMP's waiting threads sleep instead of spinning
  where other work shares the cores at a run's start, and keep OpenMP's default where none does
  (:func:`set_wait_policy`, the CLI's first act, before torch loads; ``compute.wait_policy``); a job runs on the
  usable CPUs (:func:`available_cpus`: affinity mask, cgroup quota, SLURM's CPUs) shared among the jobs running side
  by side, unless ``compute.threads`` or ``OMP_NUM_THREADS`` says otherwise (:func:`decide_threads`,
  :func:`configure_process`, recorded in environment.json); ``compute.threads=free`` (opt-in) lowers that count to the
  cores other processes leave free when the job starts (:func:`free_threads`, :func:`measure_others`); while the job
  runs with OpenMP's spinning wait (a quiet start), its model passes follow the load (:func:`follow_load`,
  ``compute.follow_load``): at a pass's start, at most once a second, the count drops to the cores other work leaves
  free and comes back when they are free again;
  :func:`fit_threads` runs a small fit or a loop of small ops (its largest op below :data:`FIT_OP_FLOPS`) on one
  thread and a larger fit on the job's count, whatever the load; :func:`threads` applies a count for a block.
- :func:`claim_gpu` — in a parallel sweep (``hydra/launcher=local_parallel``) each worker process takes a GPU of
  its own (a lock file per GPU held for the worker's life), so workers spread over the GPUs of a box.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from cprobe.errors import ConfigError

log = logging.getLogger(__name__)

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 (Linux /proc/cpuinfo names)
ARM_BF16_FLAGS = ("bf16",)  # aarch64 "Features"


# ----------------------------------------------------------------------------------------------- CPU bf16
def _cpuinfo_value(cpuinfo: str | None, keys: tuple[str, ...]) -> str | None:
    """The value of the first line of ``cpuinfo`` (default: /proc/cpuinfo) whose key is one of ``keys``; None where
    unknown."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value
    return None


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (x86 ``flags`` / ARM ``Features`` of /proc/cpuinfo); empty where unknown."""
    return set((_cpuinfo_value(cpuinfo, ("flags", "Features")) or "").split())


def cpu_model(cpuinfo: str | None = None) -> str:
    value = _cpuinfo_value(cpuinfo, ("model name", "Model", "CPU part"))
    return "unknown CPU" if value is None else value.strip()


def _probe_bf16(seconds: float = 1.0) -> bool:
    """Time a bf16 and an fp32 matmul (one thread, 256×512 @ 512×512); native bf16 is at least half as fast."""
    import torch

    with threads(1):
        a, b = torch.randn(256, 512), torch.randn(512, 512)
        ab, bb = a.bfloat16(), b.bfloat16()
        rate = {}
        deadline = time.perf_counter() + seconds
        for name, (x, y) in (("fp32", (a, b)), ("bf16", (ab, bb))):
            x @ y  # warm-up
            t0, k = time.perf_counter(), 0
            while k < 3 or (time.perf_counter() - t0 < seconds / 4 and time.perf_counter() < deadline):
                x @ y
                k += 1
            rate[name] = k / (time.perf_counter() - t0)
    return rate["bf16"] >= 0.5 * rate["fp32"]


def cpu_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (flags, else a ≤ 1 s timed probe; the detection is cached per
    process). ``CPROBE_CPU_BF16=1`` or ``0`` overrides, read at every call."""
    env = os.environ.get("CPROBE_CPU_BF16", "").strip().lower()
    if env in ("1", "true", "yes"):
        return True
    if env in ("0", "false", "no"):
        return False
    return _detect_cpu_bf16()


@lru_cache(maxsize=1)
def _detect_cpu_bf16() -> bool:
    flags = cpu_flags()
    return any(f in flags for f in BF16_FLAGS + ARM_BF16_FLAGS) if flags else _probe_bf16()


_WARNED: set[str] = set()  # the fp32 fallback is said once per process


def use_bf16(device: Any) -> bool:
    """Whether bf16 compute is worth it on ``device``: always on accelerators, on CPUs only with native bf16
    (otherwise one log line, and the caller uses fp32)."""
    if str(getattr(device, "type", device)).split(":")[0] != "cpu" or cpu_bf16():
        return True
    msg = (f"this CPU ({cpu_model()}) has no native bf16 (no {'/'.join(BF16_FLAGS)}): bf16 would run ~60x slower "
           "than fp32 here, so fp32 is used instead (set CPROBE_CPU_BF16=1 to force bf16)")
    if msg not in _WARNED:
        _WARNED.add(msg)
        log.warning(msg)
    return False


def resolve_dtype(dtype: str, device: Any) -> str:
    """The dtype name a model is loaded in: ``bfloat16``/``bf16`` on a CPU without native bf16 becomes ``float32``."""
    return "float32" if dtype in ("bfloat16", "bf16") and not use_bf16(device) else dtype


# ----------------------------------------------------------------------------------------------- threads
WAIT_ENV = "OMP_WAIT_POLICY"
WAIT_POLICIES = ("auto", "passive", "active")
"""``compute.wait_policy``: what OpenMP's idle threads do at a barrier while a sibling still works — ``passive``: sleep
at once; ``active``: spin; ``auto`` (the default): ``OMP_WAIT_POLICY`` when it is set in the environment (the
user decides), else chosen by the load at a run's start (:func:`set_wait_policy`, :data:`QUIET_BUSY`): OpenMP's
default where no other work holds a core, passive where some does. torch's pip wheels run GNU OpenMP (libgomp, in
``torch/lib``), which reads ``OMP_WAIT_POLICY`` once, when torch loads; Intel/LLVM OpenMP builds read the same
variable (passive there means ``KMP_BLOCKTIME=0`` unless that is set). Unset, libgomp spins ~300,000 times before
sleeping: on a core another process shares, a thread waiting for a descheduled sibling burns its time slice
(docs/performance.md, "A shared CPU")."""

AUTO_ENV = "CPROBE_WAIT_AUTO"
"""What ``auto`` chose at a run's start, for the job and every process it starts: ``default <busy> <cpus>`` or
``passive <busy> <cpus>`` (the cores other work kept busy, of the usable ones), ``passive`` where the load was
unreadable (:func:`set_wait_policy`)."""
QUIET_BUSY = 0.5
"""``auto`` keeps OpenMP's default wait (spin ~300,000 times, then sleep) when fewer cores than this were busy with
other work over :data:`FREE_WINDOW_S` at a run's start: a quiet machine's model passes and DAS steps ran 0.81–0.88×
as fast with passive threads as with the default there (docs/performance.md, "A shared CPU"), and 1.6–1.8× faster
than the default beside one busy process. The choice changes no float: only when idle threads sleep."""

_POLICY: dict[str, Any] = {}  # the running job's thread policy (configure_process); read by fit_thread_count


def _positive(value: Any) -> int | None:
    text = str(value if value is not None else "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _omp_threads(env: Mapping[str, str]) -> int | None:
    """``OMP_NUM_THREADS`` (its first level where it lists nested ones, ``4,2``); None when unset. Anything else is a
    one-line ConfigError."""
    raw = env.get("OMP_NUM_THREADS", "").strip()
    if not raw:
        return None
    n = _positive(raw.split(",")[0])
    if n is None:
        raise ConfigError(f"OMP_NUM_THREADS={raw!r} is not a positive thread count; set a number (e.g. 2) or unset it")
    return n


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by the cgroup quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cfs_period_us``), None if none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return int(quota) / int(period) if quota != "max" else None
    except (OSError, ValueError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(affinity: int, quota: float | None, env: Mapping[str, str]) -> tuple[int, str]:
    """(CPUs a process may use, what limits them): the affinity mask, capped by the cgroup quota (rounded up) and,
    inside a SLURM job, by the CPUs it was given (``SLURM_CPUS_PER_TASK``, else ``SLURM_CPUS_ON_NODE``: clusters
    without task affinity do not pin them); at least 1."""
    n, why = max(1, affinity), "affinity mask"
    if quota is not None and max(1, math.ceil(quota)) < n:
        n, why = max(1, math.ceil(quota)), "cgroup CPU quota"
    if env.get("SLURM_JOB_ID"):
        for var in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
            given = _positive(env.get(var))
            if given is not None:
                if given < n:
                    n, why = given, var
                break
    return n, why


def _usable(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    return usable_cpus(affinity, cgroup_cpu_quota(), os.environ if env is None else env)


def available_cpus() -> int:
    """CPUs this process may use (:func:`usable_cpus` of this process: affinity, cgroup quota, SLURM)."""
    return _usable()[0]


FIT_OP_FLOPS = 1e9
"""A fit whose largest op costs fewer flops than this runs on one thread (:func:`fit_threads`). Such an op takes
well under 50 ms on one core; split among threads, each op ends at a barrier, and on cores that anything else shares
(another task of the node, another worker, the driver) a thread waiting there for a descheduled sibling loses a
whole time slice: an INLP fit (rank 10) on 2,000 × 128 states (Hessians of 7·10⁷ flops) took 9.5–12.9 s on 2
threads against 1.5–1.9 s on one, and the reliability study's 41-point INLP grid ran 3.9× faster
(docs/performance.md). The rule reads only the fit's size, never the machine's load, so a fit's thread count — and
with it the rounding of its float sums — is the same on every run."""


FREE = "free"
"""``compute.threads=free``: auto's count, lowered to the cores not busy with other processes' work when the job starts
(:func:`free_threads`), measured over :data:`FREE_WINDOW_S` from ``/proc/stat``. Opt-in: the count then depends on the
machine's load, and with it the rounding of some float sums, so two runs of a config may differ in the last bits."""
FREE_WINDOW_S = 0.3


def thread_setting(compute: Any) -> int | None:
    """``compute.threads``: ``auto`` (default) and ``free`` (:data:`FREE`; see :func:`wants_free_threads`) are None
    here, else a positive count. A one-line ConfigError otherwise."""
    value = (compute or {}).get("threads", "auto")
    if value in ("auto", FREE):
        return None
    if isinstance(value, bool) or _positive(value) is None:
        raise ConfigError(f"compute.threads must be auto, free or a positive integer, got {value!r}")
    return int(value)


def follow_setting(compute: Any) -> bool:
    """``compute.follow_load`` (default true: the model passes' threads follow the load, :func:`follow_load`), checked:
    a one-line ConfigError for anything but a boolean."""
    value = (compute or {}).get("follow_load", True)
    if not isinstance(value, bool):
        raise ConfigError(f"compute.follow_load must be true or false, got {value!r}")
    return value


def wants_free_threads(compute: Any) -> bool:
    """Whether ``compute.threads`` is :data:`FREE`."""
    return (compute or {}).get("threads", "auto") == FREE


def cpu_jiffies(stat: str, cpus: Sequence[int]) -> tuple[int, int]:
    """(busy, total) clock ticks of the CPUs ``cpus`` since boot, from the text of ``/proc/stat``: busy is user + nice
    + system + irq + softirq + steal (guest time is inside user), total adds idle and iowait."""
    want = {f"cpu{i}" for i in cpus}
    busy = total = 0
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] in want:
            user, nice, system, idle, iowait, irq, softirq, steal = ([int(x) for x in fields[1:9]] + [0] * 8)[:8]
            b = user + nice + system + irq + softirq + steal
            busy, total = busy + b, total + b + idle + iowait
    return busy, total


def others_busy_cores(before: tuple[int, int], after: tuple[int, int], own_seconds: float, n_cpus: int,
                      hz: float) -> float:
    """Cores kept busy by other processes over a window: the CPUs' busy time (``after`` − ``before``, in ticks of
    ``hz``) less this process's own CPU time, divided by the window's length (the ticks all ``n_cpus`` CPUs counted,
    over ``n_cpus``); 0 for an empty window."""
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0 or n_cpus <= 0:
        return 0.0
    window = total / n_cpus / hz
    return max(0.0, (busy / hz - own_seconds) / window)


def free_threads(base: int, cpus: int, affinity: int, others: float) -> int:
    """``compute.threads=free``'s count: the CPUs of the affinity mask that other work leaves free (``affinity`` −
    ``others``, to the nearest core), at most the usable ``cpus`` and auto's count ``base``, at least 1."""
    return max(1, min(base, cpus, math.floor(affinity - others + 0.5)))


_clock = time.monotonic  # the readings' clock (a test's own)


def _reading() -> tuple[float, tuple[int, int], float, int] | None:
    """(monotonic time, the affinity CPUs' busy and total ticks, this process's CPU seconds, how many CPUs); None where
    ``/proc/stat`` or the affinity mask cannot be read."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        stat, t = Path("/proc/stat").read_text(), os.times()
    except (AttributeError, OSError):
        return None
    return _clock(), cpu_jiffies(stat, cpus), t.user + t.system, len(cpus)


def _others_between(before: tuple, after: tuple) -> float | None:
    """:func:`others_busy_cores` between two readings (:func:`_reading`); None where the clock tick is unknown."""
    try:
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, OSError, ValueError):
        return None
    return others_busy_cores(before[1], after[1], after[2] - before[2], after[3], hz)


def measure_others(window: float = FREE_WINDOW_S) -> tuple[float, int] | None:
    """(cores busy with other processes' work over ``window`` seconds, CPUs of the affinity mask), from
    ``/proc/stat`` and this process's CPU time; None where ``/proc/stat`` or the affinity mask cannot be read."""
    before = _reading()
    if before is None:
        return None
    time.sleep(window)
    after = _reading()
    others = None if after is None else _others_between(before, after)
    return None if others is None else (others, after[3])


FOLLOW_S = 1.0
"""A job whose passes follow the load (:func:`follow_load`) re-reads it at a model pass's start once this many seconds
have passed since the last reading: a reading is two ``/proc/stat`` reads and ``os.times`` over the time between."""
FOLLOW_STALE_S = 5.0
"""A reading older than this is only a new start, not a window to decide on: between two passes that far apart the
job itself may have kept cores busy in processes of its own (a fit pool, the portable trainer), which ``os.times``
does not count until they end, or loaded a model; the next reading, :data:`FOLLOW_S` later, decides."""
FOLLOW_MARGIN = 0.1
"""How far past the midpoint between two counts the free cores must be before :func:`follow_count` moves (hysteresis:
a neighbour near half a core busy does not flip the count at every reading)."""

_WATCH: dict[str, Any] = {}  # follow_load's last reading, the passes' count and since when, the seconds at each count
_OPEN = [0]  # threads() blocks open: inside one (a fit, a trainer) the block's count stands


def follow_count(current: int, base: int, cpus: int, affinity: int, others: float) -> int:
    """The passes' count after a reading of ``others`` busy cores: :func:`free_threads`'s count for that load, taken only
    when the free cores (``affinity`` − ``others``) lie more than :data:`FOLLOW_MARGIN` past the midpoint between the
    ``current`` count and it; else ``current``."""
    target = free_threads(base, cpus, affinity, others)
    if target != current and abs(affinity - others - current) > 0.5 + FOLLOW_MARGIN:
        return target
    return current


def _start_following(n: int) -> None:
    """A job's first reading and its passes' count ``n`` (:func:`configure_process`)."""
    _WATCH.clear()
    _WATCH.update(count=n, since=_clock(), seconds={}, changes=0)
    reading = _reading()
    if reading is not None:
        _WATCH["reading"] = reading


def follow_load() -> int | None:
    """At a model pass's start (:meth:`cprobe.models.adapter.ModelAdapter.run`, the clean-state passes, a classifier's
    fine-tuning steps, benchmarks): where the job's passes follow the load (``compute.follow_load``, on by default;
    only while OpenMP's waiting threads spin — a job whose start saw a quiet machine, or ``active`` —; never for a
    count the user fixed, a job of one thread or inside a :func:`threads` block), read the cores other processes kept
    busy since the last reading (at most every :data:`FOLLOW_S` seconds; after a gap of
    :data:`FOLLOW_STALE_S` the reading only starts a new window) and set torch's threads to the cores they leave free
    (:func:`follow_count`: at most the job's count, at least 1). What runs between passes outside a fit (DAS's and
    DBM's backward and optimiser steps, the streaming estimators' updates) runs on that count too. The count moves
    floats by float32 rounding at most (matmuls and row-wise ops split rows among threads, not sums; a whole job's
    results moved by ≤ 6e-6: docs/performance.md, "A shared CPU"), so ``compute.follow_load=false`` is the setting
    for bit-for-bit reruns whatever else runs; fits keep the job's count (:func:`fit_threads`). Returns the new count
    when it changed, else None."""
    if not _POLICY.get("follow_load") or _OPEN[0]:
        return None
    now = _clock()
    last = _WATCH.get("reading")
    if last is not None and now - last[0] < FOLLOW_S:
        return None
    reading = _reading()
    if reading is None:
        _POLICY["follow_load"] = False
        _POLICY["follow_load_from"] = "the load unreadable here (no /proc/stat)"
        return None
    _WATCH["reading"] = reading
    if last is None or reading[0] - last[0] > FOLLOW_STALE_S:
        return None
    others = _others_between(last, reading)
    if others is None:
        return None
    current = int(_WATCH["count"])
    n = follow_count(current, int(_POLICY["follow_base"]), int(_POLICY["usable_cpus"]), reading[3], others)
    if n == current:
        return None
    import torch

    torch.set_num_threads(n)
    seconds = _WATCH["seconds"]
    seconds[current] = seconds.get(current, 0.0) + reading[0] - _WATCH["since"]
    _WATCH.update(count=n, since=reading[0], changes=_WATCH["changes"] + 1)
    log.info("torch threads for the model passes: %d -> %d (%.1f of %d CPU(s) busy with other work)", current, n,
             others, reading[3])
    return n


def followed() -> dict[str, Any]:
    """What :func:`follow_load` did in this job so far: the wall-clock seconds since the job's start at each count the
    passes ran on, and how often the count changed (environment.json's ``thread_policy``; empty where the passes do
    not follow the load)."""
    if not _POLICY.get("follow_load") or "count" not in _WATCH:
        return {}
    seconds = dict(_WATCH["seconds"])
    now = int(_WATCH["count"])
    seconds[now] = seconds.get(now, 0.0) + _clock() - _WATCH["since"]
    return {"seconds_at_threads": {str(k): round(v, 1) for k, v in sorted(seconds.items(), reverse=True)},
            "thread_changes": int(_WATCH["changes"])}


def decide_threads(setting: int | None, cpus: int, workers: int = 1, env: Mapping[str, str] | None = None
                   ) -> tuple[int, str, bool]:
    """A job's intra-op threads: (count, what decided it, whether the user set it). ``compute.threads`` when set,
    else ``OMP_NUM_THREADS`` when set (the user decides either way, and every op runs on that count), else the
    usable ``cpus`` shared among ``workers`` jobs running side by side (a joblib sweep's ``n_jobs``): one thread each
    when there are as many jobs as cores. The machine's load is never read here: the start's count, and the count
    of every larger fit, is the same on every run of a config (``compute.threads=free`` opts out of that:
    :func:`configure_process`; the model passes then follow the load, :func:`follow_load`)."""
    if setting is not None:
        return setting, "compute.threads", True
    omp = _omp_threads(os.environ if env is None else env)
    if omp is not None:
        return omp, "OMP_NUM_THREADS", True
    workers = max(1, workers)
    return max(1, cpus // workers), f"{cpus} usable CPU(s) / {workers} parallel job(s)", False


def choose_threads(workers: int = 1, cpus: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """:func:`decide_threads`'s count with ``compute.threads`` at auto."""
    return decide_threads(None, available_cpus() if cpus is None else cpus, workers, env)[0]


def wait_policy_setting(compute: Any) -> str:
    """``compute.wait_policy`` (default ``auto``), checked: a one-line ConfigError for anything not in
    :data:`WAIT_POLICIES`."""
    value = (compute or {}).get("wait_policy", "auto")
    if not isinstance(value, str) or value.strip().lower() not in WAIT_POLICIES:
        raise ConfigError(f"compute.wait_policy must be one of {list(WAIT_POLICIES)}, got {value!r}")
    return value.strip().lower()


def wanted_wait_policy(setting: str, env: Mapping[str, str]) -> tuple[str, str]:
    """(the ``OMP_WAIT_POLICY`` value ``compute.wait_policy=setting`` asks for, "" for OpenMP's default; why):
    ``auto`` keeps what it chose at the run's start (:data:`AUTO_ENV`), else the environment's value, else
    ``PASSIVE``."""
    if setting == "auto":
        user = env.get(WAIT_ENV, "").strip()
        if user and user.upper() not in ("PASSIVE", "ACTIVE"):
            raise ConfigError(f"OMP_WAIT_POLICY={user!r} is neither PASSIVE nor ACTIVE (OpenMP would ignore it); "
                              "set one of them or unset it")
        chose, *seen = env.get(AUTO_ENV, "").split() or [""]
        if chose in ("default", "passive") and (chose == "default") == (not user):  # cprobe's choice at the start
            load = f"{seen[0]} of {seen[1]} CPU(s) busy with other work" if len(seen) == 2 else "the load unreadable"
            return user.upper(), f"cprobe's default, {'quiet' if user == '' else 'shared'} at the start: {load}"
        return (user.upper(), "OMP_WAIT_POLICY in the environment") if user else ("PASSIVE", "cprobe's default")
    return setting.upper(), "compute.wait_policy"


def _argv_value(argv: Sequence[str], key: str) -> str | None:
    """The value a command line's Hydra override gives ``key`` (``key=v``, ``+key=v``, ``++key=v``), else None."""
    for arg in argv:
        name, sep, value = arg.partition("=")
        if sep and name.lstrip("+") == key:
            return value
    return None


def set_wait_policy(argv: Sequence[str] = (), env: MutableMapping[str, str] | None = None,
                    torch_loaded: bool | None = None, measure: bool | None = None) -> str | None:
    """Put the wait policy in the environment before OpenMP starts: the CLI's first act, and so inherited by every
    process a job starts (joblib workers, fit pools, the portable process; SLURM tasks get it in their setup lines).
    ``compute.wait_policy`` is read from the command line (``argv``) because torch, and OpenMP with it, loads before
    the config is composed; set in a config file instead, the job checks it (:func:`check_wait_policy`). Returns the
    value set, or None when nothing was (the environment already decides, torch is loaded, or the command line's
    value is not one cprobe knows: the job refuses it in one line). ``auto`` without ``OMP_WAIT_POLICY`` reads the
    load first where ``measure`` (None: for ``cprobe run``): OpenMP's default stays where fewer than
    :data:`QUIET_BUSY` cores are busy with other work, else passive; the choice goes into :data:`AUTO_ENV`. Other
    commands (and an unreadable load) get passive without waiting to measure."""
    env = os.environ if env is None else env
    setting = (_argv_value(argv, "compute.wait_policy") or "auto").strip().lower()
    if setting not in WAIT_POLICIES or ("torch" in sys.modules if torch_loaded is None else torch_loaded):
        return None
    if setting == "auto" and not env.get(WAIT_ENV, "").strip() and (argv[:1] == ["run"] if measure is None
                                                                     else measure):
        seen = measure_others()
        quiet = seen is not None and seen[0] < QUIET_BUSY
        env[AUTO_ENV] = " ".join(["default" if quiet else "passive", *([] if seen is None else
                                                                         [f"{seen[0]:.2f}", str(seen[1])])])
        if quiet:
            return None
    try:
        value, _ = wanted_wait_policy(setting, env)
    except ConfigError:  # a bad OMP_WAIT_POLICY: the job refuses it in one line
        return None
    if env.get(WAIT_ENV, "").strip().upper() == value:
        return None
    env[WAIT_ENV] = value
    return value


def check_wait_policy(setting: str, env: MutableMapping[str, str] | None = None,
                      torch_loaded: bool | None = None) -> tuple[str, str]:
    """(the wait policy OpenMP runs this job with, what decided it) for ``compute.wait_policy=setting``. Before torch
    loads the environment is still set here; after, a policy other than the one OpenMP started with cannot take
    effect: a one-line ConfigError (``auto`` accepts OpenMP's default where torch was loaded before cprobe could set
    it, as in a notebook that imported torch first)."""
    env = os.environ if env is None else env
    loaded = "torch" in sys.modules if torch_loaded is None else torch_loaded
    want, why = wanted_wait_policy(setting, env)
    have = env.get(WAIT_ENV, "").strip().upper()
    if have == want:
        return want or "OpenMP default", why
    if not loaded:
        env[WAIT_ENV] = want
        return want, why
    if setting == "auto":
        return "OpenMP default", "torch was loaded before cprobe could set OMP_WAIT_POLICY"
    started = f"OMP_WAIT_POLICY={have}" if have else "OpenMP's default wait policy (OMP_WAIT_POLICY unset)"
    raise ConfigError(f"compute.wait_policy={setting} cannot take effect: OpenMP started with {started} when torch "
                      f"loaded, before the config was read; give compute.wait_policy={setting} on the command line "
                      f"(cprobe reads it there first) or set OMP_WAIT_POLICY={want} in the environment")


def fit_thread_count(flops_per_op: float, process_threads: int, env: Mapping[str, str] | None = None) -> int:
    """Threads for a fit whose largest op costs ``flops_per_op``: the user's count when they set one
    (``compute.threads`` for the running job, or ``OMP_NUM_THREADS``), one below :data:`FIT_OP_FLOPS`, else the
    process's (the job's: :func:`configure_process`)."""
    if env is None and _POLICY.get("threads_from") == "compute.threads":
        return int(_POLICY["threads"])
    omp = _omp_threads(os.environ if env is None else env)
    if omp is not None:
        return omp
    return 1 if flops_per_op < FIT_OP_FLOPS else process_threads


@contextmanager
def fit_threads(flops_per_op: float, device: Any = "cpu") -> Iterator[None]:
    """Run a fit or a loop of small ops (a probe's training, a logistic Newton fit, INLP, R-LACE's steps, the
    gradient attacks, an SAE's training) on the threads its size calls for (:func:`fit_thread_count`); on an
    accelerator nothing changes."""
    import torch

    if str(getattr(device, "type", device)).split(":")[0] != "cpu":
        yield
        return
    # a job whose passes follow the load: a fit takes the job's count, not the passes' of the moment, so its float
    # sums do not depend on the load (inside another block, that block's count)
    job = _POLICY.get("follow_load") and not _OPEN[0]
    with threads(fit_thread_count(flops_per_op, int(_POLICY["threads"]) if job else torch.get_num_threads())):
        yield


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (restored afterwards)."""
    import torch

    before = torch.get_num_threads()
    _OPEN[0] += 1
    try:
        if n == before:
            yield
            return
        torch.set_num_threads(max(1, n))
        try:
            yield
        finally:
            torch.set_num_threads(before)
    finally:
        _OPEN[0] -= 1


def check_threads(compute: Any) -> None:
    """The thread policy's settings, checked before any heavy work: ``compute.threads``, ``compute.wait_policy``
    (and whether it can still take effect) and ``OMP_NUM_THREADS``; a one-line ConfigError for any of them."""
    thread_setting(compute)
    follow_setting(compute)
    _omp_threads(os.environ)
    check_wait_policy(wait_policy_setting(compute))


def configure_process(workers: int = 1, compute: Any = None) -> dict[str, Any]:
    """Apply the job's thread policy to this process — ``compute.threads`` (:func:`decide_threads`: the user's count,
    else the usable CPUs shared among ``workers`` jobs side by side) and ``compute.wait_policy``
    (:func:`check_wait_policy`) — and return it as ``environment.json`` records it (also :func:`thread_policy`)."""
    import torch

    cpus, cpus_from = _usable()
    n, why, explicit = decide_threads(thread_setting(compute), cpus, workers)
    base, others = n, None
    if wants_free_threads(compute):
        n, why, explicit = decide_threads(None, cpus, workers, env={})  # auto's count: free wins over OMP_NUM_THREADS
        base = n
        why = f"compute.threads=free: {why}"
        seen = measure_others()
        if seen is None:
            why += ", the load unreadable here (no /proc/stat)"
        else:
            others, affinity = seen
            n = free_threads(n, cpus, affinity, others)
            why += f", {others:.1f} of {affinity} CPU(s) busy with other work at the job's start"
    wait, wait_from = check_wait_policy(wait_policy_setting(compute))
    if explicit and n > cpus:
        log.warning("%d torch threads (%s) on %d usable CPU(s): more threads than cores", n, why, cpus)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    log.info("torch intra-op threads: %d (%s); OpenMP wait policy %s (%s)", n, why, wait, wait_from)
    passive = wait == "PASSIVE"
    follow = follow_setting(compute) and not explicit and base > 1 and not passive
    follow_from = ("compute.follow_load=false" if not follow_setting(compute) else
                   f"the count is fixed ({why})" if explicit else "one thread: nothing to lower" if base <= 1 else
                   "OpenMP's threads sleep at a barrier (passive): a shared core costs them little" if passive else
                   f"at a pass's start, at most every {FOLLOW_S:g} s: the cores other work leaves free, "
                   f"1 to {base}")
    _POLICY.clear()
    _POLICY.update(threads=n, threads_from=why, explicit=explicit, small_fits=n if explicit else
                   f"1 below {FIT_OP_FLOPS:.0e} flops per op, else {n}", wait_policy=wait, wait_policy_from=wait_from,
                   wait_policy_setting=wait_policy_setting(compute), usable_cpus=cpus, cpus_from=cpus_from,
                   parallel_jobs=max(1, workers), follow_load=follow, follow_load_from=follow_from,
                   **({"follow_base": base} if follow else {}),
                   **({} if others is None else {"others_busy_cores": round(others, 2)}))
    _WATCH.clear()
    if follow:
        _start_following(n)
    return dict(_POLICY)


def thread_budget() -> int:
    """The threads the job may use (:func:`configure_process`; before any job :func:`choose_threads`): how many
    cores a computation with threads of its own (the two-core trainer, ``models/twocore.py``) may take."""
    return int(_POLICY["threads"]) if _POLICY else choose_threads()


def child_env() -> dict[str, str]:
    """The thread environment of a process cprobe starts (the portable process): the job's wait policy, which OpenMP
    reads when the child loads torch (so a child runs under it even where this process's OpenMP started first)."""
    want = wanted_wait_policy(_POLICY.get("wait_policy_setting", "auto"), os.environ)[0]
    return {WAIT_ENV: want} if want else {}


OPENMP_LIBRARIES = {"libgomp": "GNU OpenMP (libgomp)", "libiomp5": "Intel OpenMP (libiomp5)",
                    "libomp.": "LLVM OpenMP (libomp)"}


def openmp_runtimes(maps: str | None = None) -> list[str]:
    """The OpenMP runtimes loaded in this process (from ``/proc/self/maps``, or ``maps``): what reads
    ``OMP_WAIT_POLICY``. torch 2.13's CPU wheels bundle libgomp; scikit-learn's wheels bring their own copy."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    found = {name for line in maps.splitlines() for lib, name in OPENMP_LIBRARIES.items()
             if lib in line.rsplit("/", 1)[-1]}
    return sorted(found)


@contextmanager
def policy_kept() -> Iterator[None]:
    """The process's thread policy and :func:`follow_load`'s readings as they were before the block: a job run in
    process (``cprobe.run`` in a notebook) leaves no policy behind to steer the notebook's own passes."""
    policy, watch = dict(_POLICY), dict(_WATCH)
    try:
        yield
    finally:
        _POLICY.clear()
        _POLICY.update(policy)
        _WATCH.clear()
        _WATCH.update(watch)


def thread_policy() -> dict[str, Any]:
    """The thread policy :func:`configure_process` applied to this process's job (the last one; empty before any),
    with what :func:`follow_load` did so far (:func:`followed`)."""
    return {**_POLICY, **followed()} if _POLICY else {}


# ----------------------------------------------------------------------------------------------- GPUs
_CLAIM: dict[str, Any] = {}


def claim_gpu(n_gpus: int, lock_dir: Path | None = None) -> int | None:
    """The index of a GPU no other worker on this machine holds, claimed for the life of this process (a lock
    file per GPU); None when all are held (the caller shares one)."""
    import fcntl
    import tempfile

    if "index" in _CLAIM:
        return _CLAIM["index"]
    lock_dir = Path(lock_dir or Path(tempfile.gettempdir()) / f"cprobe-gpus-{os.getuid()}")
    lock_dir.mkdir(parents=True, exist_ok=True)
    for i in range(n_gpus):
        f = open(lock_dir / f"gpu{i}.lock", "a+")  # noqa: SIM115 - held open while the process lives
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        _CLAIM.update(index=i, file=f)
        return i
    return None


def worker_device(device: str, workers: int, job_num: int = 0, n_gpus: int | None = None,
                  lock_dir: Path | None = None) -> str:
    """The device a job of a parallel sweep uses: with several GPUs and several workers, ``cuda``/``auto`` become
    ``cuda:<i>`` for a GPU this worker holds (or ``job_num mod n`` when all are held); anything else unchanged."""
    if workers <= 1 or device not in ("auto", "cuda"):
        return device
    if n_gpus is None:
        import torch

        n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpus <= 1:
        return device
    i = claim_gpu(n_gpus, lock_dir)
    if i is None:
        i = job_num % n_gpus
        log.warning("more parallel workers than GPUs (%d): this job shares cuda:%d", n_gpus, i)
    return f"cuda:{i}"


def compute_flag(compute: Any, key: str) -> bool:
    """``compute.<key>`` (default true; a one-line ConfigError for anything but a boolean), the switches of
    :mod:`cprobe.models.resume`: ``resume``, edited passes resume at their edited layer from clean states;
    ``kv_resume``, a resumed pass edited and read at a causal LM's last token only runs that token alone above the
    edited layer, over the prefix's clean key/value cache. False runs every edited pass as a full forward
    (``resume``) or resumes that pass as any other (``kv_resume``), for comparison."""
    value = (compute or {}).get(key, True)
    if not isinstance(value, bool):
        raise ConfigError(f"compute.{key} must be true or false, got {value!r}")
    return value
