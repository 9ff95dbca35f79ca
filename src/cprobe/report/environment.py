"""``environment.json``: what a job ran on (versions, Python, platform, device), for its report."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cprobe.compute import openmp_runtimes, thread_policy
from cprobe.io import atomic_write_bytes

ENVIRONMENT = "environment.json"
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "hydra-core", "omegaconf", "scikit-learn", "numpy",
            "pandas", "pyarrow", "matplotlib")
THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "MKL_NUM_THREADS", "SLURM_CPUS_PER_TASK",
              "SLURM_CPUS_ON_NODE")
"""Environment variables that decide a job's threads, recorded when set."""


def _version(package: str) -> str | None:
    """An installed package's version from its metadata (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def cprobe_version() -> str:
    """The installed cprobe's version (package metadata: this module sits below the package top)."""
    return _version("cprobe") or "unknown"


def environment(cfg: Mapping[str, Any] | None = None, models: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Versions of cprobe and its core dependencies, Python, the platform, CPU threads (the job's thread policy,
    :func:`cprobe.compute.configure_process`, and the OpenMP runtime) and the accelerator (read from torch only when
    the job already imported it); ``models``: what the job's models were ({name: {weights,
    dtype, bos}}: e.g. "gguf Q4_K_M dequantised to float32", the start token)."""
    env: dict[str, Any] = {
        "cprobe": cprobe_version(), "python": sys.version.split()[0], "platform": platform.platform(),
        "machine": platform.machine(), "cpu_count": os.cpu_count(), "packages": {p: _version(p) for p in PACKAGES},
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        policy = thread_policy()  # the job's count (its passes may have followed the load: thread_policy's record)
        env["torch_threads"] = int(policy["threads"]) if policy else torch.get_num_threads()
        env["openmp"] = openmp_runtimes()
        env["cuda"] = cuda = bool(torch.cuda.is_available())
        if cuda:
            env["gpu"] = torch.cuda.get_device_name(0)
            env["cuda_version"] = torch.version.cuda
    if cfg is not None:
        env["device"] = str(cfg.get("device", "auto"))
        model = cfg.get("model") or {}
        if isinstance(model, Mapping) and "dtype" in model:
            env["dtype"] = str(model.get("dtype"))
    policy = thread_policy()
    if policy:
        env["thread_policy"] = policy
    if models:
        env["models"] = {name: dict(m) for name, m in models.items()}
    for var in ("HF_HUB_OFFLINE", "CPROBE_SMOKE", *THREAD_ENV):
        if os.environ.get(var):
            env.setdefault("env", {})[var] = os.environ[var]
    return env


def write_environment(out_dir: Path, cfg: Mapping[str, Any] | None = None,
                      models: Mapping[str, Any] | None = None) -> Path:
    path = Path(out_dir) / ENVIRONMENT
    atomic_write_bytes(path, json.dumps(environment(cfg, models), indent=1, default=str).encode())
    return path
