"""Every fault of issue 33's list, on the real test cluster: refused submissions (one line, exit 1, no sweep dir,
``latest`` unmoved), failing points (inside cprobe, inside Hydra), ``scancel`` of one task, SIGUSR2 to a task
(interrupted, requeued, finished points kept) and SIGTERM to the driver. Points are smoke-sized linear probes at one
layer (seconds each); a task's start-up (imports) costs more than its points, so the tests pack several points per
task and share sweeps between faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import cli
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


def _status_rows(stdout: str) -> dict[str, str]:
    """{point: state} from `cprobe status` (lines `  <state padded to 12> <point>[: why]  [task T]`)."""
    rows = {}
    for line in stdout.splitlines()[1:]:
        state, rest = line[2:14].strip(), line[15:]
        rows[rest.split(":")[0].split("  [")[0].strip()] = state
    return rows


def _task_log(d: Path) -> str:
    """The tasks' logs (for a failure message)."""
    return "\n".join(p.read_text()[-3000:] for p in sorted(d.glob(".slurm/*/*_log.out")))


def _error_lines(text: str) -> list[str]:
    return [l for l in text.splitlines() if l.startswith("error:")]


# ------------------------------------------------------------------------------------------------ refused
@pytest.fixture()
def in_process(slurm_env):
    """`cprobe` invoked in this process (tests.cli.run; the refusals need no task: a process start per case would be
    most of their cost), in the cluster's environment."""
    env = {k: slurm_env[k] for k in ("SLURM_CONF", "CPROBE_CACHE_DIR", "HF_HUB_OFFLINE")}
    return lambda *args: cli.run(*args, env=env)


@pytest.mark.parametrize("args,needle", [
    (["hydra.launcher.partition=nope"], "unknown SLURM partition 'nope'; choose from ["),
    (["compute=gpu"], "compute=gpu asks for a GPU but SLURM partition"),
    (["hydra.launcher.cpus_per_task=64"], "hydra.launcher.cpus_per_task=64 but the largest node of SLURM partition"),
    (["hydra.launcher.mem_gb=4096"], "hydra.launcher.mem_gb=4096 but the largest node of SLURM partition"),
    (["hydra.launcher.timeout_min=1"], "hydra.launcher.timeout_min=1 with signal_delay_s=120: SLURM warns a task"),
    (["+hydra.launcher.additional_parameters.time=5"], "additional_parameters.time sets what hydra.launcher."
                                                       "timeout_min sets"),
    ([], "hydra/launcher=slurm needs the slurm extra (submitit): pip install 'cprobe[slurm]'"),
], ids=["partition", "gpu-on-cpu-partition", "too-many-cpus", "too-much-memory", "timeout-vs-signal",
        "reserved-sbatch-flag", "missing-extra"])
def test_refused_submission_is_one_line_and_leaves_nothing(in_process, tmp_path, monkeypatch, args, needle):
    import sys

    out = tmp_path / "out"
    old = out / "sweeps" / "sva_tiny" / "old"
    old.mkdir(parents=True)
    (old.parent / "latest").symlink_to("old")
    if not args:  # the slurm extra missing: `import submitit` fails
        monkeypatch.setitem(sys.modules, "submitit", None)
    r = in_process(*SWEEP, "layers=3,4", *args, f"paths.output_root={out}")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    if not args:  # the whole line: not wrapped in Hydra's "Error in call to target ..."
        assert lines[0] == f"error: {needle}", r.stderr
    assert sorted(p.name for p in old.parent.iterdir()) == ["latest", "old"]  # no sweep dir
    assert os.readlink(old.parent / "latest") == "old"
    assert "submitted" not in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------------ failures, scancel
def test_failed_points_and_a_cancelled_task_are_named_and_a_rerun_submits_only_them(slurm_env, tmp_path):
    """Six points in two tasks of three, both running at once. Task 0: layers=2 finishes, layers=99 fails inside
    cprobe (its status.json says why), layers=0 fails inside Hydra (a file is where its directory goes: there is no
    status.json, only the task's record). Task 1 is cancelled with scancel while its first point runs. The driver
    names each failure and the cancelled task as it sees them, ends within a minute of the cancel with the aggregate
    of what finished and exit 1; `status` and `collect` name every point that is not done, one line each; the same
    command again is refused while the file is in the way (one line, nothing submitted), and once it is moved submits
    only those five."""
    d = tmp_path / "sweep"
    d.mkdir()
    argv = [*SWEEP, "layers=2,99,0,3,4,1", "hydra.launcher.points_per_task=3", *TWO_SLOTS, f"hydra.sweep.dir={d}"]
    driver = subprocess.Popen(cprobe_cmd(*argv), cwd=tmp_path, env=slurm_env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    try:
        tasks = wait_for(lambda: _manifest(d).get("submissions", [{}])[-1].get("tasks"), 60, "the submission")
        # in the way of task 0's third point, placed once the sweep is submitted (a sweep dir holding a file cprobe
        # did not write is refused before submission); the task runs layers=2 and 99 first
        (d / "layers=0,probe=linear").write_text("in the way\n")
        victim = sorted(tasks)[-1]
        assert tasks[victim] == ["layers=3,probe=linear", "layers=4,probe=linear", "layers=1,probe=linear"]
        wait_for(lambda: _status(d / tasks[victim][0]).get("state") == "running", 90, "the victim's first point")
        assert slurm("scancel", victim, env=slurm_env).returncode == 0
        t_cancel = time.time()
        out, _ = driver.communicate(timeout=120)
    finally:
        stop(driver)
    assert driver.returncode == 1, out
    assert time.time() - t_cancel < 60  # noticed, reported and ended within a minute of the cancel
    assert "point layers=99,probe=linear failed: layers=99 out of range" in out
    assert "point layers=0,probe=linear failed: FileExistsError" in out
    named = [l for l in out.splitlines() if f"task {victim} CANCELLED with 3 point(s) not finished" in l]
    assert len(named) == 1 and "layers=3,probe=linear (interrupted)" in named[0], out
    errors = _error_lines(out)
    assert len(errors) == 1 and errors[0].startswith("error: 5 job(s) failed"), out
    assert "; and 2 more (`cprobe status DIR` lists them)" in errors[0], out  # three named, the rest counted
    assert "Traceback" not in out and (d / "results.csv").is_file()  # what finished is aggregated
    assert out.count("sacct is not available") <= 1  # each scheduler warning once

    r = cli.run("status", str(d), cwd=tmp_path, env=slurm_env)
    assert r.returncode == 1
    assert _status_rows(r.stdout) == {
        "layers=2,probe=linear": "done", "layers=99,probe=linear": "failed", "layers=0,probe=linear": "failed",
        "layers=3,probe=linear": "interrupted", "layers=4,probe=linear": "not run", "layers=1,probe=linear": "not run"
    }, r.stdout
    assert "FileExistsError" in r.stdout and f"task {victim} CANCELLED" in r.stdout
    r = cli.run("collect", str(d), cwd=tmp_path, env=slurm_env)
    assert r.returncode == 1 and len(_error_lines(r.stderr)) == 1 and "5 job(s) not done" in r.stderr
    assert "layers=0,probe=linear" in r.stderr and "--partial" in r.stderr

    r = run(argv, tmp_path, slurm_env)  # the same command again: the user's file is still where a point goes
    log = r.stdout + r.stderr
    assert r.returncode == 1 and "layers=0,probe=linear is not a directory" in log and "submitted" not in log, log
    assert (d / "layers=0,probe=linear").read_text() == "in the way\n"  # refused before any submission, file kept
    (d / "layers=0,probe=linear").unlink()  # the user moves it away
    r = run(argv, tmp_path, slurm_env)
    log = r.stdout + r.stderr
    assert r.returncode == 1 and "1 of 6 point(s) are done already" in log and "submitted 5 point(s)" in log, log
    resubmitted = _manifest(d)["submissions"][-1]["tasks"]
    assert sorted(n for names in resubmitted.values() for n in names) == sorted(
        ["layers=99,probe=linear", "layers=0,probe=linear", *tasks[victim]])
    states = {n: _status(d / n).get("state") for n in _manifest(d)["points"]}
    assert [n for n, s in states.items() if s != "done"] == ["layers=99,probe=linear"]
    import pandas as pd

    assert sorted(pd.read_csv(d / "results.csv")["layer"].unique()) == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------------------------ preemption
def test_preempted_task_requeues_keeps_finished_points_and_outlives_its_driver(slurm_env, tmp_path):
    """SIGUSR2 (the time-limit warning; also a preemption notice) reaches the task while its second point runs:
    that point is marked interrupted, the first stays done, the task requeues itself and, started again, finishes
    without redoing the first. SIGTERM to the driver meanwhile: the task goes on; status and collect follow it."""
    d = tmp_path / "sweep"
    # cache.enabled=false: each point extracts and fits (seconds), so the second one is caught running (read from the
    # warm cache, a point can end between two polls)
    argv = [*SWEEP, "layers=2,3,4", "cache.enabled=false", f"hydra.sweep.dir={d}"]
    driver = subprocess.Popen(cprobe_cmd(*argv), cwd=tmp_path, env=slurm_env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    try:
        tasks = wait_for(lambda: _manifest(d).get("submissions", [{}])[-1].get("tasks"), 60, "the submission")
        (task, names), = tasks.items()
        wait_for(lambda: _status(d / names[1]).get("state") == "running", 120, "the second point to run", step=0.1,
                 on_timeout=lambda: _task_log(d))
        first = _status(d / names[0])
        assert first["state"] == "done"
        assert slurm("scancel", "--signal=USR2", task, env=slurm_env).returncode == 0
        wait_for(lambda: _record(d, task).get("state") == "requeued", 60, "the task to requeue itself",
                 on_timeout=lambda: _task_log(d))
        second = _status(d / names[1])
        assert second["state"] == "interrupted" and second["signal"] == "SIGUSR2", (second, _task_log(d))
        # SLURM holds a requeued job for 2 minutes (BeginTime); time passing is not what this test is about. Not
        # `now`: slurmd refuses a job started within the second its last run's credential was revoked ("Job
        # credential revoked": the requeue, under a second ago) and the task then never runs again
        wait_for(lambda: "PENDING" in slurm("squeue", "-h", "-j", task, "-o", "%T", env=slurm_env).stdout, 60,
                 "the requeued task to be pending")
        r = slurm("scontrol", "update", f"JobId={task}", "StartTime=now+2", env=slurm_env)
        assert r.returncode == 0, r.stderr
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=60)
    finally:
        stop(driver)
    assert driver.returncode == 143, out + _task_log(d)
    assert f"SLURM job {task.split('_')[0]} goes on: `cprobe status" in out and "Traceback" not in out, out
    r = cli.run("status", str(d), cwd=tmp_path, env=slurm_env)
    assert r.returncode == 0, r.stdout + r.stderr + _task_log(d)  # queued or running again: nothing needs a re-run
    assert "interrupted by SIGUSR2, requeued" in r.stdout or "running" in r.stdout or "3 done" in r.stdout
    wait_for(lambda: all(_status(d / n).get("state") == "done" for n in names), 150, "the requeued task",
             on_timeout=lambda: _task_log(d))
    r = cli.run("status", str(d), cwd=tmp_path, env=slurm_env)
    assert r.returncode == 0 and "3 point(s): 3 done" in r.stdout, r.stdout + r.stderr
    assert _status(d / names[0])["started"] == first["started"]  # the finished point was not redone
    # the task writes its record after its last point's status.json: wait for it (seen once: still "running")
    rec = wait_for(lambda: (r := _record(d, task)).get("state") == "done" and r, 30, "the task's final record",
                   on_timeout=lambda: _task_log(d))
    assert rec["restarts"] == 1 and len(rec["runs"]) == 2
    assert rec["runs"][0]["signal"] == "SIGUSR2"
    r = cli.run("collect", str(d), cwd=tmp_path, env=slurm_env)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------------ a re-run's truth
def test_a_rerun_reports_its_own_attempt_and_a_scontrol_requeue_is_no_cancel(slurm_env, tmp_path):
    """Issue 43's reproduction: the sweep fails (an unusable cache), then the same command with a working cache. The
    old points' status.json say failed; while the new task starts up neither the driver nor `cprobe status` says so
    (the points are queued). `scontrol requeue` of the task while it runs its first point: the task says the
    scheduler requeued it (not "cancelled with scancel"), runs again and finishes; the driver exits 0 with both
    points aggregated, and `cprobe collect` agrees."""
    d = tmp_path / "sweep"
    argv = ["run", "-m", "+experiment=sva_tiny", "probe=linear", "layers=4", "seed=1,2", "--smoke",
            "hydra/launcher=slurm", "hydra.launcher.poll_s=2", f"hydra.sweep.dir={d}"]
    r = run(argv, tmp_path, {**slurm_env, "CPROBE_CACHE_DIR": "/proc/nocache"})
    assert r.returncode == 1 and "error: 2 job(s) failed" in r.stderr, r.stdout + r.stderr
    names = list(_manifest(d)["points"])
    old = {n: _status(d / n) for n in names}
    assert [s["state"] for s in old.values()] == ["failed", "failed"], old

    # the same command with a working cache: a fresh one, holding the trained tiny model, so that the first point
    # extracts (seconds) and is caught running
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(Path(slurm_env["CPROBE_CACHE_DIR"]) / "models")
    driver = subprocess.Popen(cprobe_cmd(*argv), cwd=tmp_path, env={**slurm_env, "CPROBE_CACHE_DIR": str(cache)},
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        sub = wait_for(lambda: len(_manifest(d).get("submissions", [])) == 2 and _manifest(d)["submissions"][-1],
                       60, "the second submission")
        (task, packed), = sub["tasks"].items()
        attempt = f"{sub['token']}:{task}"
        st = cli.run("status", str(d), cwd=tmp_path, env=slurm_env)
        rows = _status_rows(st.stdout)
        assert st.returncode == 0 and set(rows.values()) <= {"queued", "running", "done"}, st.stdout + st.stderr
        if all(_status(d / n).get("attempt") != attempt for n in names):  # the new task had written nothing yet
            assert set(rows.values()) == {"queued"}, st.stdout
        wait_for(lambda: (s := _status(d / packed[0])).get("state") == "running" and s.get("attempt") == attempt,
                 120, "the first point to run", step=0.1, on_timeout=lambda: _task_log(d))
        assert slurm("scontrol", "requeue", task, env=slurm_env).returncode == 0
        wait_for(lambda: _record(d, task).get("state") == "requeued", 60, "the task to record the requeue",
                 on_timeout=lambda: _task_log(d))
        wait_for(lambda: "PENDING" in slurm("squeue", "-h", "-j", task, "-o", "%T", env=slurm_env).stdout, 60,
                 "the requeued task to be pending")
        r = slurm("scontrol", "update", f"JobId={task}", "StartTime=now+2", env=slurm_env)  # not SLURM's 2 minutes
        assert r.returncode == 0, r.stderr
        out, _ = driver.communicate(timeout=240)
    finally:
        stop(driver)
    log = _task_log(d)
    assert driver.returncode == 0, out + log
    assert old[names[0]]["error"] not in out and " failed:" not in out, out  # nothing of the first attempt's
    assert "SIGTERM with the job requeued by the scheduler (scontrol requeue" in log, log
    assert "cancelled with scancel" not in log and "not requeued" not in log, log
    assert all(_status(d / n)["state"] == "done" and _status(d / n)["attempt"] == attempt for n in names)
    assert _record(d, task)["restarts"] == 1
    import pandas as pd

    assert sorted(pd.read_csv(d / "results.csv")["seed"].unique()) == [1, 2]
    r = cli.run("collect", str(d), cwd=tmp_path, env=slurm_env)
    assert r.returncode == 0, r.stderr
