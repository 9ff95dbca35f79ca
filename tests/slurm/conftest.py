"""One real single-node SLURM cluster for the `slurm` tests (scripts/slurm_up.sh), shared by the whole session.

Where it comes from, in order: the cluster ``$SLURM_CONF`` points at when it answers (``.ci/run`` starts one before
``make test``); else, as root with slurm-wlm and munge installed, one started here in a private directory on free
ports and stopped (by its daemons' own pids) when the session ends; else every `slurm` test skips, saying why —
and fails instead when ``CPROBE_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli import EXE, launch

REPO = Path(__file__).resolve().parents[2]
UP = REPO / "scripts" / "slurm_up.sh"
DOWN = REPO / "scripts" / "slurm_down.sh"
SHARED_CACHE = Path(os.environ.get("CPROBE_CACHE_DIR", REPO / ".cache" / "cprobe-test"))


def _answers(conf: str) -> bool:
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10,
                           env={**os.environ, "SLURM_CONF": conf})
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and any(s in r.stdout for s in ("idle", "mix", "alloc"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unavailable(reason: str):
    if os.environ.get("CPROBE_REQUIRE_SLURM", "") not in ("", "0"):
        pytest.fail(f"CPROBE_REQUIRE_SLURM=1 but no SLURM cluster: {reason}", pytrace=False)
    pytest.skip(f"no SLURM cluster: {reason} (scripts/slurm_up.sh starts one as root; CI does)")


@pytest.fixture(scope="session")
def slurm_conf(tmp_path_factory):
    """The SLURM_CONF of a cluster that answers (started here if need be)."""
    conf = os.environ.get("SLURM_CONF", "")
    if conf and _answers(conf):
        yield conf
        return
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        _unavailable("slurm-wlm/munge are not installed (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        _unavailable("the test cluster's daemons run as root, and this is not root")
    d = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "CPROBE_SLURM_DIR": str(d), "CPROBE_SLURM_CTLD_PORT": str(_free_port()),
           "CPROBE_SLURM_SLURMD_PORT": str(_free_port())}
    r = subprocess.run(["bash", str(UP)], capture_output=True, text=True, env=env, timeout=180)
    if r.returncode != 0:
        subprocess.run(["bash", str(DOWN)], env=env, capture_output=True, timeout=60)
        _unavailable(f"scripts/slurm_up.sh failed: {r.stderr.strip()[-500:]}")
    try:
        yield str(d / "slurm.conf")
    finally:
        subprocess.run(["bash", str(DOWN)], env=env, capture_output=True, timeout=60)


def pytest_collection_modifyitems(config, items):
    """A `slurm` test drives a real scheduler, whose timing (a requeue's start, a point between two polls of its
    status file) varies with the machine's load: a failed one runs up to twice more (pytest-rerunfailures), each time
    in a fresh directory with fresh jobs; a fault that fails every time is reported."""
    for it in items:
        if it.get_closest_marker("slurm") is not None and it.get_closest_marker("flaky") is None:
            it.add_marker(pytest.mark.flaky(reruns=2, reruns_delay=2))


@pytest.fixture(scope="session")
def tiny_model(slurm_conf):
    """The suite's tiny BERT trained (once, cached) before any task needs it."""
    import cprobe

    cprobe.load_model("tiny_bert_sva")
    return SHARED_CACHE


@pytest.fixture()
def slurm_env(slurm_conf, tiny_model, tmp_path):
    """The environment of a cprobe command on the cluster; the test's jobs still queued or running at its end are
    cancelled (found through the sweep manifests under its tmp_path)."""
    env = {**os.environ, "SLURM_CONF": slurm_conf, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
           "CPROBE_CACHE_DIR": str(tiny_model), "PYTHONUNBUFFERED": "1"}
    yield env
    import json

    ids = set()
    for m in tmp_path.rglob(".slurm/sweep.json"):
        try:
            ids |= {str(s["job_id"]) for s in json.loads(m.read_text()).get("submissions", [])}
        except (OSError, ValueError, KeyError):
            continue
    if ids:
        subprocess.run(["scancel", *sorted(ids)], env=env, capture_output=True, timeout=30)


def cprobe_cmd(*args: str) -> list[str]:
    """The console script's argv, for a driver the test signals while it runs (stdout and stderr on one pipe)."""
    return [str(EXE), *args]


def run(args, cwd, env, timeout=240) -> subprocess.CompletedProcess:
    """A sweep's driver as a process (tests.cli.launch): the scheduler's jobs start their own; `cprobe status` and
    `cprobe collect` run in process (tests.cli.run)."""
    return launch(*args, cwd=cwd, env=env, timeout=timeout)


def slurm(*argv: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=30)


def wait_for(predicate, timeout: float, what: str, step: float = 0.5, on_timeout=None):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = predicate()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + (f"\n{on_timeout()}" if on_timeout is not None else ""))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
