"""The portable process: a ``python`` started with the CPU's numerics pinned (:func:`portable_env`: ATen and MKL on
their AVX2 code paths, one intra-op thread), so a computation run there — tiny-model training
(:func:`cprobe.models.tiny.train_portable`) — gives bitwise the same result on every x86-64 CPU with AVX2.

One process is kept for the life of the job and fed one job at a time (:func:`run_portable`); what it runs is named
by import path, so this module depends on none of its callers.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from cprobe.compute import child_env
from cprobe.errors import ModelLoadError

# One thread for every tiny-model training run: the matrices are tiny (intra-op threads cost more than they gain,
# 5x slower on a busy 2-core box), and a fixed thread count fixes the order of every parallel reduction. The job's
# own thread count (chosen per machine) applies to everything else.
TRAIN_THREADS = 1


def portable_env() -> dict[str, str]:
    """The environment of the portable training process: what makes tiny-model training bitwise the same on every
    x86-64 CPU with AVX2 (AVX2 or AVX-512, Intel or AMD), at any thread count, as far as torch allows.

    Without it, the same seed gives other weights on another machine: ATen's kernels (softmax, layer norm, GELU,
    reductions, even ``normal_`` initialisation) are compiled once per instruction set and picked at start-up by the
    CPU (``ATEN_CPU_CAPABILITY``), and MKL's GEMM picks its code path by CPU model (pinned by its conditional
    numerical reproducibility mode, ``MKL_CBWR``). CPUs without AVX2 (e.g. ARM) keep their own paths: they reproduce
    among themselves only."""
    env = {"OMP_NUM_THREADS": str(TRAIN_THREADS), "MKL_NUM_THREADS": str(TRAIN_THREADS),
           "ONEDNN_MAX_CPU_ISA": "AVX2"}
    if torch.cpu._is_avx2_supported():
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", MKL_CBWR="AVX2,STRICT")
    return env


def numerics_mode() -> str:
    """``avx2`` when training is pinned to the AVX2 paths (part of the corpus models' cache key), else ``native``."""
    return "avx2" if "ATEN_CPU_CAPABILITY" in portable_env() else "native"


class _Worker:
    """The portable process: one ``python`` started under :func:`portable_env` (the CPU paths are fixed when torch
    starts, so they cannot be pinned in a process that has already computed anything), kept for the life of this
    process and fed one job file at a time over stdin (its answer: one JSON line on stdout)."""

    _CODE = "from cprobe.models.portable import _serve; _serve()"
    _MARK = "cprobe-train: "

    def __init__(self) -> None:
        import threading

        self.proc: Any = None
        self.lock = threading.Lock()

    def run(self, target: str, job: dict, what: str) -> dict:
        import atexit
        import subprocess
        import sys

        with self.lock, tempfile.TemporaryDirectory(prefix="cprobe-train-") as tmp:
            path = Path(tmp) / "job.json"
            path.write_text(json.dumps({"target": target, "job": job}))
            if self.proc is None or self.proc.poll() is not None:
                env = {**os.environ, **child_env(), **portable_env()}  # the wait policy too: OpenMP reads it at start
                self.proc = subprocess.Popen([sys.executable, "-c", self._CODE], env=env, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True)
                atexit.register(self.close)
            try:
                self.proc.stdin.write(f"{path}\n")
                self.proc.stdin.flush()
                while True:
                    line = self.proc.stdout.readline()
                    if not line:
                        raise BrokenPipeError
                    if line.startswith(self._MARK):
                        answer = json.loads(line[len(self._MARK):])
                        break
            except (BrokenPipeError, OSError, ValueError):
                self.close()
                raise ModelLoadError(f"the portable process {what} died (out of memory?)") from None
        if "error" in answer:
            raise ModelLoadError(f"{what} failed: {answer['error']}")
        return answer["ok"]

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001  (it is going away either way)
                proc.kill()


_WORKER = _Worker()


def run_portable(target: str, job: dict, what: str) -> dict:
    """``target(job)`` (``"module:function"``, taking and returning plain JSON) run in the portable process; ``what``
    names the work in errors (``"training a tiny bert model"``)."""
    return _WORKER.run(target, job, what)


def _serve() -> None:
    """The loop of the portable process (:class:`_Worker`): a job file path per stdin line."""
    import importlib
    import sys

    answers, sys.stdout = sys.stdout, sys.stderr  # anything else printed goes to stderr
    torch.set_num_threads(TRAIN_THREADS)
    torch.use_deterministic_algorithms(True)
    for line in sys.stdin:
        try:
            spec = json.loads(Path(line.strip()).read_text())
            module, name = spec["target"].split(":")
            answer = {"ok": getattr(importlib.import_module(module), name)(spec["job"])}
        except Exception as e:  # noqa: BLE001  (reported to the parent, which raises it)
            answer = {"error": f"{type(e).__name__}: {e}"}
        answers.write(_Worker._MARK + json.dumps(answer) + "\n")
        answers.flush()
