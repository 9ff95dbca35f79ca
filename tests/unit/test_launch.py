"""The SLURM launcher's pieces without a cluster: parsing the scheduler's answers, fitting a request to a partition
(and refusing it in one line), packing, every point state a sweep can be in, the requeue decision, and the build lock
that makes concurrent jobs build a cache entry once. (tests/slurm runs the whole against a real cluster.)"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
import torch

from cprobe import slurmctl
from cprobe import sweep as S
from cprobe.errors import ConfigError
from cprobe.launch import packing, resources
from cprobe.slurmctl import NodeGroup, Partition, TaskState

SINFO = """cpu*|up|1-00:00:00|4|32|128000|(null)
gpu|up|4:00:00|2|64|512000|gpu:a100:4(S:0-1)
gpu|up|4:00:00|1|16|64000|gpu:2
old|down|infinite|1|8|16000|(null)
"""


def _settled(st: S.SweepState) -> bool:
    """Nothing more will happen to the sweep without a re-run: every point in a terminal state."""
    return all(p.state in S.TERMINAL for p in st.points)


# ------------------------------------------------------------------------------------------------ slurmctl
@pytest.mark.parametrize("text,minutes", [("infinite", None), ("UNLIMITED", None), ("1-00:00:00", 1440),
                                          ("4:00:00", 240), ("30:00", 30), ("45", 45), ("0:30", 1), ("2-1:0:0", 2940)])
def test_parse_minutes(text, minutes):
    assert slurmctl.parse_minutes(text) == minutes


@pytest.mark.parametrize("gres,n", [("(null)", 0), ("gpu:4", 4), ("gpu:a100:4(S:0-1)", 4), ("gpu:a:2,gpu:b:1", 3),
                                    ("shard:8", 0), ("gpu", 1)])
def test_parse_gpus(gres, n):
    assert slurmctl.parse_gpus(gres) == n


def test_parse_partitions():
    parts = slurmctl.parse_partitions(SINFO)
    assert sorted(parts) == ["cpu", "gpu", "old"]
    cpu, gpu, old = parts["cpu"], parts["gpu"], parts["old"]
    assert cpu.default and not gpu.default and not old.up
    assert cpu.max_minutes == 1440 and gpu.max_minutes == 240 and old.max_minutes is None
    assert gpu.groups == [NodeGroup(2, 64, 512000, 4), NodeGroup(1, 16, 64000, 2)]
    assert (gpu.gpus, gpu.cpus, gpu.mem_mb, cpu.gpus) == (4, 64, 512000, 0)


def test_scheduler_warnings_are_logged_once(caplog):
    slurmctl._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="cprobe"):
        for job in (12, 13, 14):
            slurmctl.warn_once(f"squeue -j {job} failed: timeout")
    assert len(caplog.records) == 1


# ------------------------------------------------------------------------------------------------ resources
PARTS = slurmctl.parse_partitions(SINFO)
TINY = {"debug": Partition("debug", True, True, None, [NodeGroup(1, 2, 21694, 0)])}


def _req(devices, parts=PARTS, **params):
    return resources.resolve({"timeout_min": 60, **params}, devices, parts)


def test_gpus_follow_the_device():
    assert _req(["cpu"]).gpus == 0 and _req(["auto"]).gpus == 0  # the default partition has no GPUs
    assert _req(["cuda"], partition="gpu").gpus == 1 and _req(["auto"], partition="gpu").gpus == 1
    assert _req(["cpu"], partition="gpu").gpus == 0
    assert _req(["cuda"], partition="gpu", gpus_per_node=2).gpus == 2


def test_cpus_and_memory_from_the_partition():
    r = _req(["cpu"])  # 32-CPU, 125 GB nodes: 8 CPUs and their share of memory, at most 32 GB
    assert (r.cpus, r.mem_gb) == (8, 31.25)
    g = _req(["cuda"], partition="gpu")  # a GPU's share of a 64-CPU, 4-GPU node: 16 CPUs, capped at 8
    assert (g.cpus, g.gpus) == (8, 1) and g.mem_gb == 32
    t = _req(["auto"], TINY)  # the test cluster: all of the 2-CPU node
    assert (t.cpus, t.gpus, t.partition) == (2, 0, "debug") and t.mem_gb == 21
    e = _req(["cpu"], cpus_per_task=4, mem_gb=6.5)
    assert (e.cpus, e.mem_gb) == (4, 6.5)
    assert e.sbatch_flags()["mem"] == "6656M" and e.sbatch_flags()["gpus-per-node"] is None


@pytest.mark.parametrize("devices,params,needle", [
    (["cpu"], {"partition": "nope"}, "unknown SLURM partition 'nope'; choose from ['cpu', 'gpu', 'mixed', 'old']"),
    (["cpu"], {"partition": "old"}, "SLURM partition 'old' is not up"),
    (["cuda"], {}, "compute=gpu asks for a GPU but SLURM partition 'cpu' has no GPUs"),
    (["cuda"], {}, "a partition with GPUs: ['gpu']"),
    (["cuda"], {"partition": "gpu", "gpus_per_node": 0}, "gpus_per_node=0"),
    (["cpu"], {"gpus_per_node": 1}, "gpus_per_node=1 asks for 1 GPU(s) per node but SLURM partition 'cpu'"),
    (["cuda"], {"partition": "gpu", "gpus_per_node": 8}, "has at most 4 per node"),
    (["cpu"], {"cpus_per_task": 64}, "cpus_per_task=64 but the largest node of SLURM partition 'cpu' has 32"),
    (["cpu"], {"mem_gb": 500}, "mem_gb=500 but the largest node of SLURM partition 'cpu' has 125.0 GB"),
    (["cpu"], {"timeout_min": 2000}, "timeout_min=2000 exceeds SLURM partition 'cpu''s time limit of 1440 min"),
    (["cpu"], {"cpus_per_task": "many"}, "cpus_per_task='many' must be an integer or auto"),
    (["cpu"], {"mem_gb": -1}, "mem_gb=-1 must be > 0"),
    (["cpu"], {"partition": "mixed", "cpus_per_task": 32, "mem_gb": 100},
     "no node of SLURM partition 'mixed' has 32 CPU(s), 100 GB (1 node(s) of 64 CPUs, 62 GB"),
])
def test_unsatisfiable_requests_are_refused_in_one_line(devices, params, needle):
    mixed = Partition("mixed", False, True, None, [NodeGroup(1, 64, 64000, 0), NodeGroup(1, 8, 512000, 0)])
    with pytest.raises(ConfigError) as e:
        _req(devices, {**PARTS, "mixed": mixed}, **params)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_slots():
    r = _req(["cpu"], cpus_per_task=8, mem_gb=8)
    assert resources.slots(r, PARTS["cpu"], 100) == 16 and resources.slots(r, PARTS["cpu"], 5) == 5
    t = _req(["cpu"], TINY, cpus_per_task=1, mem_gb=2)
    assert resources.slots(t, TINY["debug"], 16) == 2


# ------------------------------------------------------------------------------------------------ settings
def test_the_launchers_defaults_pass_its_own_checks():
    from cprobe.launch import settings

    out = settings.check({})
    assert out == {**settings.DEFAULTS, "setup": [], "additional_parameters": {}}
    # the shortest time limit the default warning fits: 120 s + 60 s of slack is half of 6 minutes
    assert settings.check({"timeout_min": 6})["timeout_min"] == 6
    assert settings.check({"timeout_min": 3, "signal_delay_s": 30})["signal_delay_s"] == 30
    assert settings.check({"additional_parameters": {"mail_type": "END", "gres": "tmpdisk:10", "requeue": True}}
                          )["additional_parameters"] == {"mail-type": "END", "gres": "tmpdisk:10", "requeue": True}
    assert settings.check({"max_requeues": 0, "additional_parameters": {"no-requeue": True}})["max_requeues"] == 0


@pytest.mark.parametrize("params,needle", [
    ({"timeout_min": 1}, "hydra.launcher.timeout_min=1 with signal_delay_s=120: SLURM warns a task (SIGUSR2) 120 s "
                         "before its time limit, and up to 60 s earlier still, so a task would be stopped and "
                         "requeued after at most 0 s of its 60 s, round after round; the warning may take at most "
                         "half a task's time: raise timeout_min to 6 or more"),
    ({"timeout_min": 5}, "after at most 120 s of its 300 s"),
    ({"timeout_min": 5}, "raise timeout_min to 6 or more, or lower hydra.launcher.signal_delay_s to 90 or less"),
    ({"timeout_min": 60, "signal_delay_s": 1800}, "raise timeout_min to 62 or more, or lower"),
    ({"timeout_min": 0}, "hydra.launcher.timeout_min=0 must be >= 1"),
    ({"timeout_min": -5}, "hydra.launcher.timeout_min=-5 must be >= 1"),
    ({"timeout_min": 2.5}, "hydra.launcher.timeout_min=2.5 must be an integer"),
    ({"signal_delay_s": 0}, "hydra.launcher.signal_delay_s=0 must be >= 1"),
    ({"signal_delay_s": 70000, "timeout_min": 10000}, "signal_delay_s=70000 exceeds SLURM's 65535 s"),
    ({"max_requeues": -1}, "hydra.launcher.max_requeues=-1 must be >= 0"),
    ({"array_parallelism": 0}, "hydra.launcher.array_parallelism=0 must be >= 1"),
    ({"points_per_task": 0}, "hydra.launcher.points_per_task=0 must be >= 1 or auto"),
    ({"points_per_task": "some"}, "hydra.launcher.points_per_task='some' must be an integer or auto"),
    ({"poll_s": 0}, "hydra.launcher.poll_s=0 must be a number of seconds >= 1"),
    ({"detach": "yes"}, "hydra.launcher.detach='yes' must be true or false"),
    ({"setup": "module load cuda"}, "hydra.launcher.setup='module load cuda' must be a list of shell lines"),
    ({"partition": ""}, "hydra.launcher.partition='' must be a non-empty string"),
    ({"additional_parameters": ["x"]}, "hydra.launcher.additional_parameters=['x'] must be a mapping"),
    ({"additional_parameters": {"time": 10}}, "hydra.launcher.additional_parameters.time sets what "
                                              "hydra.launcher.timeout_min sets (sbatch would get both); use "
                                              "hydra.launcher.timeout_min instead"),
    ({"additional_parameters": {"cpus_per_task": 4}}, "use hydra.launcher.cpus_per_task instead"),
    ({"additional_parameters": {"mem-per-cpu": "2G"}}, "use hydra.launcher.mem_gb instead"),
    ({"additional_parameters": {"signal": "USR1@60"}}, "use hydra.launcher.signal_delay_s instead"),
    ({"additional_parameters": {"gres": "gpu:2"}}, "asks for GPUs, which hydra.launcher.gpus_per_node sets"),
    ({"additional_parameters": {"ntasks_per_node": 2}}, "ntasks-per-node=2: each array task is one process"),
    ({"additional_parameters": {"nodes": 2}}, "additional_parameters.nodes=2: each array task is one process"),
    ({"additional_parameters": {"output": "x.log"}}, "cprobe writes the tasks' logs itself"),
    ({"additional_parameters": {"no-requeue": True}}, "forbids the requeues hydra.launcher.max_requeues=3 asks for"),
    ({"qeue": "x"}, "unknown hydra.launcher key(s) ['qeue'] for the SLURM launcher"),
])
def test_impossible_launcher_settings_are_refused_in_one_line(params, needle):
    from cprobe.launch import settings

    with pytest.raises(ConfigError) as e:
        settings.check(params)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


# ------------------------------------------------------------------------------------------------ packing
def test_points_sharing_a_model_are_packed_together():
    overrides = [["model=a", "intervention.rank=0"], ["model=b", "intervention.rank=0"],
                 ["model=a", "intervention.rank=1"], ["model=b", "intervention.rank=1"],
                 ["model=a", "intervention.rank=2"], ["model=b", "intervention.rank=2"]]
    keys = [packing.group_key(o) for o in overrides]
    assert keys[0] == keys[2] == ("model=a",) and keys[0] != keys[1]
    assert packing.pack(keys, 3) == [[0, 2, 4], [1, 3, 5]]
    assert packing.pack(keys, 6) == [[0, 2, 4, 1, 3, 5]]
    assert packing.pack(keys, 1) == [[0], [2], [4], [1], [3], [5]]
    assert packing.group_key(["+experiment=x", "probe=mlp", "seed=2", "dataset.max_examples=5"]) == (
        "+experiment=x", "dataset.max_examples=5")


def test_pack_sizes_are_balanced():
    sizes = [len(t) for t in packing.pack([()] * 41, 3)]
    assert len(sizes) == 14 and sum(sizes) == 41 and max(sizes) - min(sizes) <= 1
    assert packing.per_task("auto", 41, 2) == 21 and packing.per_task(None, 5, 16) == 1
    assert packing.per_task(4, 41, 2) == 4
    with pytest.raises(ConfigError, match="points_per_task=0 must be >= 1"):
        packing.per_task(0, 5, 1)


# ------------------------------------------------------------------------------------------------ point states
def _sweep(tmp_path, statuses: dict, records: dict | None = None) -> Path:
    names = ["a", "b", "c", "d"]
    S.write_manifest(tmp_path, {"version": 1, "points": {n: {"num": i, "overrides": []} for i, n in enumerate(names)},
                                "submissions": [{"job_id": "7", "tasks": {"7_0": ["a", "b"], "7_1": ["c", "d"]}}]})
    for name, st in statuses.items():
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "status.json").write_text(json.dumps(st))
    for task, rec in (records or {}).items():
        S.write_record(tmp_path, task, rec)
    return tmp_path


ELSEWHERE = {"state": "running", "pid": 1, "host": "a-compute-node"}


def _states(d, tasks):
    return {p.name: p.state for p in S.sweep_state(d, task_states=tasks).points}


def test_point_states_from_status_records_and_scheduler(tmp_path):
    d = _sweep(tmp_path, {"a": {"state": "done"}, "b": ELSEWHERE, "c": {"state": "interrupted", "signal": "SIGUSR2"}},
               {"7_1": {"state": "requeued", "restarts": 1, "points": {"c": {"state": "interrupted"}}}})
    live = {"7_0": TaskState("RUNNING"), "7_1": TaskState("PENDING", "BeginTime")}
    st = S.sweep_state(d, task_states=live)
    assert {p.name: p.state for p in st.points} == {"a": "done", "b": "running", "c": "queued", "d": "queued"}
    c = next(p for p in st.points if p.name == "c")
    assert "interrupted by SIGUSR2, requeued (1 restart(s))" in c.detail and "PENDING (BeginTime)" in c.detail
    assert not _settled(st) and st.summary() == "4 point(s): 1 done, 1 running, 2 queued"
    # the tasks end: cancelled with b running and d not started; or vanished from the scheduler altogether
    ended = {"7_0": TaskState("CANCELLED"), "7_1": TaskState("CANCELLED")}
    assert _states(d, ended) == {"a": "done", "b": "dead", "c": "interrupted", "d": "not run"}
    assert _states(d, {}) == {"a": "done", "b": "dead", "c": "interrupted", "d": "not run"}
    st = S.sweep_state(d, task_states={})
    assert _settled(st) and "the scheduler no longer knows it" in next(p for p in st.points if p.name == "d").detail
    assert [p.split(":")[0] for p in st.problems()] == ["b", "c", "d"]


def test_a_point_that_failed_inside_hydra_is_known_from_its_task_record(tmp_path):
    d = _sweep(tmp_path, {"a": {"state": "done"}, "c": {"state": "failed", "error": "bad layer"}, "d": {"state": "done"}},
               {"7_0": {"state": "done", "points": {"b": {"state": "failed", "error": "FileExistsError: b"}}}})
    st = S.sweep_state(d, scheduler=False)  # nothing the scheduler could add: it is not asked
    assert {p.name: (p.state, p.detail) for p in st.points} == {
        "a": ("done", ""), "b": ("failed", "FileExistsError: b"), "c": ("failed", "bad layer"), "d": ("done", "")}
    assert S.sweep_state(d).scheduler is False
    covered, problems = S.manifest_problems(d)
    assert covered == {(d / n).resolve(): n in "ad" for n in "abcd"}
    assert problems == ["b: FileExistsError: b", "c: bad layer"]


def test_a_sweep_without_manifest_reads_its_status_files(tmp_path):
    for name, st in {"x": {"state": "done"}, "y": {"state": "failed", "error": "boom"}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "status.json").write_text(json.dumps(st))
    st = S.sweep_state(tmp_path)
    assert [(p.name, p.state, p.detail) for p in st.points] == [("x", "done", ""), ("y", "failed", "boom")]


def _rerun_sweep(tmp_path) -> Path:
    """The issue's reproduction, as files: submission ``old`` (job 7) ran points a and b; a finished, b failed (its
    cache unusable). The same command again submits b alone (job 8, token ``new``), whose task has not reached it."""
    S.write_manifest(tmp_path, {"version": 1, "points": {"a": {"num": 0, "overrides": []},
                                                         "b": {"num": 1, "overrides": []}}, "submissions": [
        {"job_id": "7", "token": "old", "tasks": {"7_0": ["a"], "7_1": ["b"]}},
        {"job_id": "8", "token": "new", "tasks": {"8_0": ["b"]}}]})
    for name, st in {"a": {"state": "done", "attempt": "old:7_0"},
                     "b": {"state": "failed", "error": "cannot create /proc/nocache", "attempt": "old:7_1"}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "status.json").write_text(json.dumps(st))
    (tmp_path / "b" / "metrics.parquet").write_text("an earlier attempt's")
    return tmp_path


def test_a_point_s_state_is_its_newest_attempts_never_an_earlier_ones(tmp_path, monkeypatch):
    d = _rerun_sweep(tmp_path)
    pending = {"7_0": TaskState("COMPLETED"), "7_1": TaskState("COMPLETED"), "8_0": TaskState("PENDING", "Priority")}
    st = S.sweep_state(d, task_states=pending)
    assert {p.name: p.state for p in st.points} == {"a": "done", "b": "queued"}  # not the old "failed"
    assert st.problems() == ["b: queued (PENDING (Priority))"] and not _settled(st)
    running = {**pending, "8_0": TaskState("RUNNING")}
    assert _states(d, running) == {"a": "done", "b": "queued"}  # its task starts up: b not reached yet
    # the files alone (no scheduler here): b has not started in this attempt, whatever the old file says
    assert {p.name: p.state for p in S.sweep_state(d, scheduler=False).points} == {"a": "done", "b": "not started"}
    # an old record under the new task's id (job ids restart with a new cluster) is another attempt's too
    S.write_record(d, "8_0", {"attempt": "older:8_0", "state": "done",
                              "points": {"b": {"state": "failed", "error": "stale"}}})
    assert _states(d, running) == {"a": "done", "b": "queued"}
    monkeypatch.setattr(slurmctl, "available", lambda: True)  # `cprobe collect` asks the scheduler
    monkeypatch.setattr(slurmctl, "states", lambda jobs: running)
    covered, problems = S.manifest_problems(d)  # collect: b's old metrics are not this attempt's result
    b_queued = "b: queued (its task runs and has not reached it yet)"
    assert covered == {(d / "a").resolve(): True, (d / "b").resolve(): False} and problems == [b_queued]
    from cprobe.results import find_jobs

    (d / "a" / "metrics.parquet").write_text("")
    assert find_jobs(d, (covered, problems)) == ([d / "a"], [b_queued])
    # the new attempt reaches b: its own status.json counts, whatever it says
    (d / "b" / "status.json").write_text(json.dumps({"state": "running", "pid": 1, "host": "a-compute-node",
                                                     "attempt": "new:8_0"}))
    assert _states(d, running) == {"a": "done", "b": "running"}
    (d / "b" / "status.json").write_text(json.dumps({"state": "failed", "error": "new", "attempt": "new:8_0"}))
    assert [(p.state, p.detail) for p in S.sweep_state(d, task_states=running).points][1] == ("failed", "new")
    (d / "b" / "status.json").write_text(json.dumps({"state": "done", "attempt": "new:8_0"}))
    assert _states(d, {**running, "8_0": TaskState("COMPLETED")}) == {"a": "done", "b": "done"}


def test_a_newest_attempt_that_ended_before_its_point_says_so(tmp_path):
    d = _rerun_sweep(tmp_path)
    ended = {"8_0": TaskState("CANCELLED")}
    st = S.sweep_state(d, task_states=ended)
    assert [(p.name, p.state) for p in st.points] == [("a", "done"), ("b", "not run")]
    assert "task 8_0 CANCELLED before it started" in st.points[1].detail
    # a point its task found done (the job skipped it, writing nothing): the task's record of this attempt says so
    S.write_record(d, "8_0", {"attempt": "new:8_0", "state": "done", "points": {"b": {"state": "done"}}})
    assert _states(d, ended) == {"a": "done", "b": "done"}


def test_a_task_records_its_attempt_in_every_status_it_writes(tmp_path, monkeypatch):
    from cprobe.job import ATTEMPT_ENV, read_status, write_status

    monkeypatch.delenv(ATTEMPT_ENV, raising=False)
    write_status(tmp_path, state="done")
    assert read_status(tmp_path) == {"state": "done"}  # a local run: no attempt
    monkeypatch.setenv(ATTEMPT_ENV, S.attempt_id("tok", "8_0"))
    write_status(tmp_path, state="running")
    assert read_status(tmp_path) == {"state": "running", "attempt": "tok:8_0"}


# ------------------------------------------------------------------------------------------------ requeue
@pytest.mark.parametrize("signame,info,restarts,expected", [
    ("SIGUSR2", {}, 0, "requeue"),
    ("SIGUSR2", {}, 3, "stop"),  # max_requeues reached
    ("SIGTERM", {"JobState": "RUNNING", "Reason": "None", "Restarts": "0"}, 0, "requeue"),  # a preemption notice
    ("SIGTERM", {"JobState": "COMPLETING", "Reason": "TimeLimit", "Restarts": "0"}, 0, "requeue"),
    ("SIGTERM", {"JobState": "COMPLETING", "Reason": "None", "Restarts": "0"}, 0, "stop"),  # scancel
    ("SIGTERM", {"JobState": "COMPLETING", "Reason": "None", "Restarts": "1"}, 0, "requeued"),  # scontrol requeue
    ("SIGTERM", {"JobState": "COMPLETING", "Reason": "None", "Restarts": "2"}, 1, "requeued"),
    ("SIGTERM", {"JobState": "COMPLETING", "Reason": "None", "Restarts": "1"}, 1, "stop"),  # scancel, restarted once
    ("SIGINT", {}, 0, "stop"),
])
def test_requeue_decision(monkeypatch, signame, info, restarts, expected):
    from cprobe.launch import slurm

    monkeypatch.setattr(slurmctl, "job_info", lambda job: info)
    action, why = slurm._should_requeue("7_1", signame, restarts, 3)
    assert action == expected and why
    if signame == "SIGTERM" and expected == "stop":
        assert "scancel" in why
    if expected == "requeued":
        assert "requeued by the scheduler (scontrol requeue" in why and "scancel" not in why


# ------------------------------------------------------------------------------------------------ build lock
def test_a_waiter_says_what_it_waits_for_and_who_builds_it(tmp_path, caplog):
    from cprobe.cache import build_lock

    held, release = threading.Event(), threading.Event()

    def builder():
        with build_lock(tmp_path / "entry.lock", "the entry"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=builder)
    t.start()
    held.wait(10)
    threading.Timer(0.3, release.set).start()
    with caplog.at_level(logging.INFO, logger="cprobe"):
        t0 = time.time()
        with build_lock(tmp_path / "entry.lock", "the entry"):
            waited = time.time() - t0
    t.join()
    text = caplog.text
    assert waited >= 0.25 and "waiting for the entry: pid" in text and "building since" in text
    assert "waited" in text and "reading it" in text
    assert not (tmp_path / "entry.lock.owner").exists()


def test_concurrent_oracle_fits_build_once(tmp_path, monkeypatch, caplog):
    """Two jobs ask for the same oracle at once: one fits it, the other waits on its lock and reads it back."""
    from cprobe.probes import build_probe
    from cprobe.tasks import sites as rel

    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 4, generator=g)
    y = (X[:, 0] > 0).long()
    cfg = {"name": "linear", "lrs": [0.1], "epochs": 2, "batch_size": 16, "seed": 0}
    key = {"oracle": "z_c", "probe": cfg, "acts": ["m", "f", "float32", "d", 4, "target"]}
    fits = []
    cls = type(build_probe(cfg))
    real_fit = cls.fit

    def slow_fit(self, *a, **k):
        fits.append(threading.get_ident())
        time.sleep(0.5)
        return real_fit(self, *a, **k)

    monkeypatch.setattr(cls, "fit", slow_fit)
    rel._MEMO.clear()
    monkeypatch.setattr(rel, "_MEMO", {})  # each "job" its own process memory: the disk cache is all they share

    class Memo(dict):  # per-thread memo, as two processes would have
        def __init__(self):
            self.local = threading.local()

        def _d(self):
            if not hasattr(self.local, "d"):
                self.local.d = {}
            return self.local.d

        def __contains__(self, k):
            return k in self._d()

        def __getitem__(self, k):
            return self._d()[k]

        def __setitem__(self, k, v):
            self._d()[k] = v

    monkeypatch.setattr(rel, "_MEMO", Memo())
    sources = []
    with caplog.at_level(logging.INFO, logger="cprobe"):
        threads = [threading.Thread(target=lambda: sources.append(
            rel.memo_probe(key, build_probe(cfg), X, y, tmp_path)[1])) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join()
    assert len(fits) == 1 and sorted(sources) == ["disk", "fit"]
    assert "waiting for a LinearProbe fit on 60 rows" in caplog.text  # the probe-fit cache names what it waits on


def test_a_slurm_task_uses_the_cpus_it_was_given(monkeypatch):
    """task/none pins nothing: the affinity mask shows the whole node, SLURM_CPUS_PER_TASK what the task got."""
    from cprobe import compute

    monkeypatch.setattr(compute.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(compute, "cgroup_cpu_quota", lambda root=None: None)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert compute.available_cpus() == 16  # not inside a job: a stray variable means nothing
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert compute.available_cpus() == 2


def test_cluster_settings_in_local_slurm_yaml_reach_the_slurm_launcher_only(tmp_path):
    """conf/local/slurm.yaml (here on an added search path) sets the SLURM launcher's partition; a run on the basic
    launcher composes as before (the README's old advice, a partition in conf/local/default.yaml, broke every run)."""
    from hydra import compose, initialize_config_dir

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "slurm.yaml").write_text("partition: gpu\naccount: lab\nqos: high\n")
    extra = f"hydra.searchpath=[file://{tmp_path}]"
    with initialize_config_dir(config_dir=str(repo / "conf"), version_base="1.3"):
        slurm = compose("config", ["+experiment=sva_tiny", "hydra/launcher=slurm", extra], return_hydra_config=True)
        basic = compose("config", ["+experiment=sva_tiny", extra], return_hydra_config=True)
        cli = compose("config", ["+experiment=sva_tiny", "hydra/launcher=slurm", extra,
                                 "hydra.launcher.partition=debug"], return_hydra_config=True)
    launcher = slurm.hydra.launcher
    assert (launcher.partition, launcher.account, launcher.qos) == ("gpu", "lab", "high")
    assert launcher._target_ == "hydra_plugins.cprobe_launcher.slurm_launcher.SlurmLauncher"
    assert "partition" not in basic.hydra.launcher and "local" not in basic
    assert cli.hydra.launcher.partition == "debug"  # the command line wins


@pytest.mark.numeric
def test_the_weights_fingerprint_does_not_depend_on_threads():
    """A 1-CPU SLURM task and a 2-thread local run must key the same cache entries for the same model."""
    from types import SimpleNamespace

    from cprobe.models.load import fingerprint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 3))
    adapter = SimpleNamespace(name="m", model=model)
    before = torch.get_num_threads()
    try:
        prints = set()
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            prints.add(fingerprint(adapter))
    finally:
        torch.set_num_threads(before)
    assert len(prints) == 1
    with torch.no_grad():
        model[0].weight[300, 7] += 1e-3  # one weight deep inside a tensor changes it
    assert fingerprint(adapter) not in prints
