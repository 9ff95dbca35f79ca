"""The hardware a job runs on: native bf16 on this CPU, how many threads fit, which GPU a parallel worker takes.

- :func:`cpu_bf16` — whether this CPU computes bf16 natively (x86 AVX512-BF16 or AMX, ARM BF16), from the CPU's
  flags, else a timed probe (≤ 1 s, once per process). On AVX2-only CPUs a bf16 matmul is ~90× slower than fp32, so
  :func:`resolve_dtype` / :func:`use_bf16` fall back to fp32 there with one log line (``CPROBE_CPU_BF16=1|0``
  overrides the detection).
- :func:`available_cpus` — the CPUs this process may use: its affinity mask and the cgroup CPU quota.
- :func:`choose_threads` — a job's intra-op threads from the usable CPUs, the parallel workers sharing them and
  ``OMP_NUM_THREADS`` (the model's forward runs on these); :func:`fit_threads` runs a small fit (its largest op below
  :data:`FIT_OP_FLOPS`) on one thread; :func:`threads` applies a count for a block. Small ops split among threads
  spin at every barrier on cores anything else shares: one thread is faster there.
- :func:`claim_gpu` — in a parallel sweep (``hydra/launcher=local_parallel``) each worker process takes a GPU of
  its own (a lock file per GPU held for the worker's life), so workers spread over the GPUs of a box.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
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


def available_cpus() -> int:
    """CPUs this process may use: the affinity mask, capped by the cgroup quota (rounded up) and, inside a SLURM job,
    by the CPUs it was given (``SLURM_CPUS_PER_TASK``: clusters without task affinity do not pin them), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if slurm.isdigit() and int(slurm) > 0 and os.environ.get("SLURM_JOB_ID"):
        n = min(n, int(slurm))
    return max(1, n)


FIT_OP_FLOPS = 1e9
"""A fit whose largest op costs fewer flops than this runs on one thread (:func:`fit_threads`). Such an op takes
well under 50 ms on one core; split among threads, each op ends at a barrier, and on cores that anything else shares
(another task of the node, another worker, the driver) a thread waiting there for a descheduled sibling loses a
whole time slice: an INLP fit (rank 10) on 2,000 × 128 states (Hessians of 7·10⁷ flops) took 9.5–12.9 s on 2
threads against 1.5–1.9 s on one, and the reliability study's 41-point INLP grid ran 3.9× faster
(docs/performance.md). The rule reads only the fit's size, never the machine's load, so a fit's thread count — and
with it the rounding of its float sums — is the same on every run."""


def choose_threads(workers: int = 1, cpus: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """A job's intra-op threads: ``OMP_NUM_THREADS`` when set (the user decides), else the usable CPUs shared among
    ``workers`` parallel processes."""
    env = os.environ if env is None else env
    omp = _user_threads(env)
    if omp is not None:
        return omp
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, workers))


def _user_threads(env: Mapping[str, str]) -> int | None:
    omp = env.get("OMP_NUM_THREADS", "").strip()
    return int(omp) if omp.isdigit() and int(omp) > 0 else None


def fit_thread_count(flops_per_op: float, process_threads: int, env: Mapping[str, str] | None = None) -> int:
    """Threads for a fit whose largest op costs ``flops_per_op``: ``OMP_NUM_THREADS`` when set (the user decides),
    one below :data:`FIT_OP_FLOPS`, else the process's (the job's: :func:`configure_process`)."""
    omp = _user_threads(os.environ if env is None else env)
    if omp is not None:
        return omp
    return 1 if flops_per_op < FIT_OP_FLOPS else process_threads


@contextmanager
def fit_threads(flops_per_op: float, device: Any = "cpu") -> Iterator[None]:
    """Run a fit (a probe's training, a logistic Newton fit, INLP) on the threads its size calls for
    (:func:`fit_thread_count`); on an accelerator nothing changes."""
    import torch

    if str(getattr(device, "type", device)).split(":")[0] != "cpu":
        yield
        return
    with threads(fit_thread_count(flops_per_op, torch.get_num_threads())):
        yield


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (restored afterwards)."""
    import torch

    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def configure_process(workers: int = 1) -> int:
    """Set this process's torch threads for ``workers`` parallel jobs sharing the machine; returns the count."""
    import torch

    n = choose_threads(workers=workers)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
        log.info("torch intra-op threads: %d (%d usable CPUs, %d parallel worker(s))", n, available_cpus(), workers)
    return n


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


def resume_flag(compute: Any) -> bool:
    """``compute.resume`` (default true): edited passes resume at their edited layer from clean states
    (:mod:`cprobe.models.resume`); false runs every edited pass as a full forward, for comparison. A one-line
    ConfigError for anything but a boolean."""
    return _flag(compute, "resume")


def kv_resume_flag(compute: Any) -> bool:
    """``compute.kv_resume`` (default true): a resumed pass edited and read at a causal LM's last token only runs
    that token alone above the edited layer, over the prefix's clean key/value cache (:mod:`cprobe.models.resume`);
    false resumes it as any other pass, for comparison. A one-line ConfigError for anything but a boolean."""
    return _flag(compute, "kv_resume")


def _flag(compute: Any, key: str) -> bool:
    value = (compute or {}).get(key, True)
    if not isinstance(value, bool):
        raise ConfigError(f"compute.{key} must be true or false, got {value!r}")
    return value
