"""Every fault of issue 33's list, on the real test cluster: refused submissions (one line, exit 1, no sweep dir,
``latest`` unmoved), failing points (inside cprobe, inside Hydra), ``scancel`` of one task, SIGUSR2/SIGTERM to a
task (interrupted, requeued, finished points kept), SIGTERM to the driver, and the shared cache under two
concurrent tasks. Points are smoke-sized linear probes at one layer: each costs seconds; the tasks' start-up
(imports) dominates, so sweeps pack several points per task."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm.conftest import cprobe_cmd, run, slurm, stop, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SWEEP = ["run", "-m", "+experiment=sva_tiny", "probe=linear", "--smoke", "hydra/launcher=slurm",
         "hydra.launcher.poll_s=2"]
TWO_SLOTS = ["hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2"]  # two tasks at once on the 2-CPU node


def _status(d: Path) -> dict:
    try:
        return json.loads((d / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _manifest(d: Path) -> dict:
    try:
        return json.loads((d / ".slurm" / "sweep.json").read_text())
    except (OSError, ValueError):
        return {}


def _record(d: Path, task: str) -> dict:
    try:
        return json.loads((d / ".slurm" / "tasks" / f"{task}.json").read_text())
    except (OSError, ValueError):
        return {}


def _error_lines(text: str) -> list[str]:
    return [l for l in text.splitlines() if l.startswith("error:")]


# ------------------------------------------------------------------------------------------------ refused
@pytest.fixture()
def no_submitit(tmp_path):
    """A PYTHONPATH on which `import submitit` fails, as where the slurm extra is not installed."""
    d = tmp_path / "no_submitit"
    (d / "submitit").mkdir(parents=True)
    (d / "submitit" / "__init__.py").write_text("raise ImportError(\"No module named 'submitit'\")\n")
    return str(d)


@pytest.mark.parametrize("args,needle", [
    (["hydra.launcher.partition=nope"], "unknown SLURM partition 'nope'; choose from ["),
    (["compute=gpu"], "compute=gpu asks for a GPU but SLURM partition"),
    (["hydra.launcher.cpus_per_task=64"], "hydra.launcher.cpus_per_task=64 but the largest node of SLURM partition"),
    (["hydra.launcher.mem_gb=4096"], "hydra.launcher.mem_gb=4096 but the largest node of SLURM partition"),
    ([], "needs the slurm extra (submitit): pip install 'cprobe[slurm]'"),
], ids=["partition", "gpu-on-cpu-partition", "too-many-cpus", "too-much-memory", "missing-extra"])
def test_refused_submission_is_one_line_and_leaves_nothing(slurm_env, tmp_path, no_submitit, args, needle):
    out = tmp_path / "out"
    old = out / "sweeps" / "sva_tiny" / "old"
    old.mkdir(parents=True)
    (old.parent / "latest").symlink_to("old")
    env = {**slurm_env, "PYTHONPATH": no_submitit} if not args else slurm_env
    r = run([*SWEEP, "layers=3,4", *args, f"paths.output_root={out}"], tmp_path, env)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert sorted(p.name for p in old.parent.iterdir()) == ["latest", "old"]  # no sweep dir
    assert os.readlink(old.parent / "latest") == "old"
    assert "submitted" not in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------------ failing points
def test_failing_points_are_named_by_driver_status_and_collect(slurm_env, tmp_path):
    """layers=99 fails inside cprobe (its status.json says so); `layers=3,probe=linear` cannot get its directory (a
    file is in the way) and fails inside Hydra, before any status.json; layers=4 finishes and is aggregated."""
    d = tmp_path / "sweep"
    d.mkdir()
    (d / "layers=3,probe=linear").write_text("in the way\n")
    r = run([*SWEEP, "layers=3,4,99", f"hydra.sweep.dir={d}"], tmp_path, slurm_env)
    log = r.stdout + r.stderr
    assert r.returncode == 1, log
    assert "point layers=99,probe=linear failed: layers=99 out of range" in log
    assert "point layers=3,probe=linear failed: FileExistsError" in log
    errors = _error_lines(r.stderr)
    assert len(errors) == 1 and "2 job(s) failed" in errors[0] and "layers=99" in errors[0], r.stderr
    assert "Traceback" not in log and (d / "results.csv").is_file()  # the rest aggregated
    r = run(["status", str(d)], tmp_path, slurm_env)
    assert r.returncode == 1
    failed = [l.strip() for l in r.stdout.splitlines() if l.strip().startswith("failed")]
    assert len(failed) == 2 and any("layers=99" in l and "out of range" in l for l in failed), r.stdout
    assert any("layers=3,probe=linear: FileExistsError" in l for l in failed), r.stdout
    assert "1 done" in r.stdout and "2 failed" in r.stdout
    r = run(["collect", str(d)], tmp_path, slurm_env)
    assert r.returncode == 1 and len(_error_lines(r.stderr)) == 1
    assert "layers=99,probe=linear" in r.stderr and "layers=3,probe=linear" in r.stderr and "--partial" in r.stderr
    r = run(["collect", str(d), "--partial"], tmp_path, slurm_env)
    assert r.returncode == 0, r.stderr
    import pandas as pd

    assert sorted(pd.read_csv(d / "results.csv")["layer"].unique()) == [4]


# ------------------------------------------------------------------------------------------------ scancel
def test_scancel_of_one_task_is_named_and_a_rerun_submits_only_its_points(slurm_env, tmp_path):
    d = tmp_path / "sweep"
    argv = [*SWEEP, "layers=1,2,3,4", "hydra.launcher.points_per_task=2", *TWO_SLOTS, f"hydra.sweep.dir={d}"]
    driver = subprocess.Popen(cprobe_cmd(*argv), cwd=tmp_path, env=slurm_env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    try:
        tasks = wait_for(lambda: _manifest(d).get("submissions", [{}])[-1].get("tasks"), 60, "the submission")
        victim = sorted(tasks)[-1]
        wait_for(lambda: _status(d / tasks[victim][0]).get("state") == "running", 90, "the victim's first point")
        assert slurm("scancel", victim, env=slurm_env).returncode == 0
        t_cancel = time.time()
        out, _ = driver.communicate(timeout=120)
    finally:
        stop(driver)
    assert driver.returncode == 1, out
    named = [l for l in out.splitlines() if f"task {victim} CANCELLED with" in l]
    assert named and "not finished" in named[0], out
    assert time.time() - t_cancel < 60  # reported (and ended) within a minute of the cancel
    assert "Traceback" not in out
    r = run(["status", str(d)], tmp_path, slurm_env)
    assert r.returncode == 1
    lost = tasks[victim]
    for name in lost:
        line = next(l for l in r.stdout.splitlines() if f" {name}" in l)
        assert line.split()[0] in ("interrupted", "dead", "not"), r.stdout
        assert victim in line
    r = run(argv, tmp_path, slurm_env)  # the same command again
    assert r.returncode == 0, r.stdout + r.stderr
    log = r.stdout + r.stderr
    assert "2 of 4 point(s) are done already" in log and "submitted 2 point(s)" in log
    latest = _manifest(d)["submissions"][-1]
    assert sorted(n for names in latest["tasks"].values() for n in names) == sorted(lost)
    assert all(_status(d / n).get("state") == "done" for n in _manifest(d)["points"])


# ------------------------------------------------------------------------------------------------ preemption
def test_preempted_task_requeues_keeps_finished_points_and_outlives_its_driver(slurm_env, tmp_path):
    """SIGUSR2 (the time-limit warning; also a preemption notice) reaches the task while its second point runs:
    that point is marked interrupted, the first stays done, the task requeues itself and, started again, finishes
    without redoing the first. SIGTERM to the driver meanwhile: the task goes on; status and collect follow it."""
    d = tmp_path / "sweep"
    argv = [*SWEEP, "layers=2,3,4", f"hydra.sweep.dir={d}"]
    driver = subprocess.Popen(cprobe_cmd(*argv), cwd=tmp_path, env=slurm_env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    try:
        tasks = wait_for(lambda: _manifest(d).get("submissions", [{}])[-1].get("tasks"), 60, "the submission")
        (task, names), = tasks.items()
        wait_for(lambda: _status(d / names[1]).get("state") == "running", 120, "the second point to run")
        first = _status(d / names[0])
        assert first["state"] == "done"
        assert slurm("scancel", "--signal=USR2", task, env=slurm_env).returncode == 0
        wait_for(lambda: _record(d, task).get("state") == "requeued", 60, "the task to requeue itself")
        assert _status(d / names[1])["state"] == "interrupted" and _status(d / names[1])["signal"] == "SIGUSR2"
        # SLURM holds a requeued job for 2 minutes (BeginTime); time passing is not what this test is about
        wait_for(lambda: "PENDING" in slurm("squeue", "-h", "-j", task, "-o", "%T", env=slurm_env).stdout, 60,
                 "the requeued task to be pending")
        assert slurm("scontrol", "update", f"JobId={task}", "StartTime=now", env=slurm_env).returncode == 0
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=60)
    finally:
        stop(driver)
    assert driver.returncode == 143, out
    assert f"SLURM job {task.split('_')[0]} goes on: `cprobe status" in out and "Traceback" not in out
    r = run(["status", str(d)], tmp_path, slurm_env)
    assert r.returncode == 0, r.stdout + r.stderr  # queued or running again: nothing needs a re-run
    assert "interrupted by SIGUSR2, requeued" in r.stdout or "running" in r.stdout or "3 done" in r.stdout
    wait_for(lambda: "3 done" in run(["status", str(d)], tmp_path, slurm_env).stdout, 150, "the requeued task",
             step=2)
    assert _status(d / names[0])["started"] == first["started"]  # the finished point was not redone
    rec = _record(d, task)
    assert rec["restarts"] == 1 and rec["state"] == "done" and len(rec["runs"]) == 2
    assert rec["runs"][0]["signal"] == "SIGUSR2"
    r = run(["collect", str(d)], tmp_path, slurm_env)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------------ shared cache
def test_concurrent_tasks_build_each_cache_entry_once(slurm_env, tmp_path):
    """Two reliability tasks at once on an empty cache: one extracts and fits the oracles, the other waits on the
    entries' locks (saying what it waits for) and reads them."""
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(Path(slurm_env["CPROBE_CACHE_DIR"]) / "models", cache / "models",
                    ignore=shutil.ignore_patterns("*.lock", "*.owner", ".*"))
    env = {**slurm_env, "CPROBE_CACHE_DIR": str(cache)}
    d = tmp_path / "sweep"
    r = run(["run", "-m", "+experiment=sva_tiny_reliability", "--smoke", "hydra/launcher=slurm",
             "hydra.launcher.poll_s=2", "intervention=mean_diff,leace", "reliability.oracle_probe=linear",
             "hydra.launcher.points_per_task=1", *TWO_SLOTS, f"hydra.sweep.dir={d}"], tmp_path, env)
    assert r.returncode == 0, r.stdout + r.stderr
    logs = "".join(p.read_text() for p in d.glob("*/cprobe.log"))
    assert "waiting for" in logs, logs[-3000:]
    import pandas as pd

    sources = {}
    for job in sorted(d.glob("intervention=*")):
        assert json.loads((job / "status.json").read_text())["state"] == "done"
        sources[job.name] = str(pd.read_csv(job / "timings.csv")["probe_source"].iloc[0])
    built = [j for j, s in sources.items() if "oracle_z_c=fit" in s]
    assert len(built) == 1, sources  # fitted by one task, read from the disk cache by the other
    assert all("oracle_z_c=disk" in s for j, s in sources.items() if j not in built), sources
