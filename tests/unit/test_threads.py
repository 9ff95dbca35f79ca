"""The thread policy (issue 53; docs/performance.md, "A shared CPU"): its decisions as pure functions of the CPU
count, the environment and the jobs running side by side (hand-made cases), the wait policy set before OpenMP
starts, overrides honoured and bad values refused in one line, and the record in environment.json."""

from __future__ import annotations

import os

import pytest
import torch

from cprobe import compute
from cprobe.config import identity
from cprobe.errors import ConfigError

SLURM = {"SLURM_JOB_ID": "7"}


@pytest.fixture
def clean_policy():
    """The process's thread policy and torch threads as they were (configure_process changes both)."""
    before, watch, threads = dict(compute._POLICY), dict(compute._WATCH), torch.get_num_threads()
    yield
    compute._POLICY.clear()
    compute._POLICY.update(before)
    compute._WATCH.clear()
    compute._WATCH.update(watch)
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------- usable CPUs
@pytest.mark.parametrize("affinity,quota,env,expected", [
    (8, None, {}, (8, "affinity mask")),
    (8, 2.5, {}, (3, "cgroup CPU quota")),  # a quota of 2.5 CPUs still runs 3 threads' worth at times: rounded up
    (8, 0.2, {}, (1, "cgroup CPU quota")),
    (4, 16.0, {}, (4, "affinity mask")),  # a quota above the mask limits nothing
    (16, None, {**SLURM, "SLURM_CPUS_PER_TASK": "4"}, (4, "SLURM_CPUS_PER_TASK")),
    (16, None, {**SLURM, "SLURM_CPUS_ON_NODE": "6"}, (6, "SLURM_CPUS_ON_NODE")),  # no --cpus-per-task
    (16, None, {**SLURM, "SLURM_CPUS_PER_TASK": "4", "SLURM_CPUS_ON_NODE": "8"}, (4, "SLURM_CPUS_PER_TASK")),
    (2, None, {**SLURM, "SLURM_CPUS_PER_TASK": "4"}, (2, "affinity mask")),  # pinned tighter than SLURM says
    (16, None, {"SLURM_CPUS_PER_TASK": "4"}, (16, "affinity mask")),  # not inside a job: a stray variable
    (16, None, {**SLURM, "SLURM_CPUS_PER_TASK": "x"}, (16, "affinity mask")),
    (0, None, {}, (1, "affinity mask")),
])
def test_usable_cpus(affinity, quota, env, expected):
    assert compute.usable_cpus(affinity, quota, env) == expected


# ----------------------------------------------------------------------------------------------- the count
@pytest.mark.parametrize("setting,cpus,workers,env,expected", [
    (None, 8, 1, {}, (8, "8 usable CPU(s) / 1 parallel job(s)", False)),
    (None, 8, 2, {}, (4, "8 usable CPU(s) / 2 parallel job(s)", False)),  # a joblib sweep, n_jobs=2
    (None, 2, 2, {}, (1, "2 usable CPU(s) / 2 parallel job(s)", False)),  # one thread per job side by side
    (None, 2, 4, {}, (1, "2 usable CPU(s) / 4 parallel job(s)", False)),
    (None, 3, 2, {}, (1, "3 usable CPU(s) / 2 parallel job(s)", False)),
    (None, 8, 0, {}, (8, "8 usable CPU(s) / 1 parallel job(s)", False)),
    (None, 8, 2, {"OMP_NUM_THREADS": "3"}, (3, "OMP_NUM_THREADS", True)),  # the user decides
    (None, 8, 1, {"OMP_NUM_THREADS": "4,2"}, (4, "OMP_NUM_THREADS", True)),  # nested levels: the first
    (None, 8, 1, {"OMP_NUM_THREADS": " "}, (8, "8 usable CPU(s) / 1 parallel job(s)", False)),
    (5, 8, 2, {"OMP_NUM_THREADS": "3"}, (5, "compute.threads", True)),  # the config beats the environment
    (16, 2, 1, {}, (16, "compute.threads", True)),  # more than the cores: the user's call (a warning)
])
def test_decide_threads(setting, cpus, workers, env, expected):
    assert compute.decide_threads(setting, cpus, workers, env) == expected


@pytest.mark.parametrize("value", ["0", "-2", "two", "2.5"])
def test_a_bad_omp_num_threads_is_one_line(value):
    with pytest.raises(ConfigError, match=f"OMP_NUM_THREADS='{value}' is not a positive thread count") as e:
        compute.decide_threads(None, 8, 1, {"OMP_NUM_THREADS": value})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("compute_cfg,expected", [
    ({}, None), ({"threads": "auto"}, None), ({"threads": 2}, 2), ({"threads": "3"}, 3), (None, None),
    ({"threads": "free"}, None),
])
def test_thread_setting(compute_cfg, expected):
    assert compute.thread_setting(compute_cfg) == expected


@pytest.mark.parametrize("value", [0, -1, True, "two", 1.5, None, "AUTO"])
def test_a_bad_thread_setting_is_one_line(value):
    with pytest.raises(ConfigError, match=r"compute.threads must be auto, free or a positive integer, got") as e:
        compute.thread_setting({"threads": value})
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------- compute.threads=free
STAT = """cpu  500 0 300 1000 20 0 0 0 0 0
cpu0 100 5 50 400 10 3 2 1 0 0
cpu1 200 0 100 300 10 0 0 0 0 0
cpu10 7 0 0 0 0 0 0 0 0 0
intr 12345
"""


def test_wants_free_threads():
    assert compute.wants_free_threads({"threads": "free"})
    assert not any(compute.wants_free_threads(c) for c in ({}, None, {"threads": "auto"}, {"threads": 2}))


def test_cpu_jiffies_sums_the_listed_cpus_only():
    # cpu0: busy 100+5+50+3+2+1 = 161, total 161+400+10 = 571; cpu1: busy 300, total 610; cpu10 and the all-CPU
    # line are not cpu0/cpu1
    assert compute.cpu_jiffies(STAT, [0]) == (161, 571)
    assert compute.cpu_jiffies(STAT, [0, 1]) == (461, 1181)
    assert compute.cpu_jiffies(STAT, [5]) == (0, 0)


@pytest.mark.parametrize("before,after,own,n,hz,expected", [
    ((0, 0), (150, 200), 0.5, 2, 100, 1.0),   # 1 s window on 2 CPUs: 1.5 s busy, 0.5 s of it ours -> 1 core of others
    ((100, 1000), (200, 1200), 0.0, 2, 100, 1.0),  # 1 s, 1 s busy, none ours
    ((0, 0), (100, 400), 1.0, 4, 100, 0.0),   # all the busy time is ours
    ((0, 0), (50, 200), 0.9, 2, 100, 0.0),    # own time counted over the window's edges: never below 0
    ((5, 5), (5, 5), 0.0, 2, 100, 0.0),       # an empty window
])
def test_others_busy_cores(before, after, own, n, hz, expected):
    assert compute.others_busy_cores(before, after, own, n, hz) == pytest.approx(expected)


@pytest.mark.parametrize("base,cpus,affinity,others,expected", [
    (2, 2, 2, 0.0, 2), (2, 2, 2, 0.3, 2),     # quiet, or a light load: both cores
    (2, 2, 2, 1.0, 1), (2, 2, 2, 0.6, 1),     # one busy process (or most of one): one thread
    (2, 2, 2, 2.0, 1), (2, 2, 2, 5.0, 1),     # never below one
    (4, 4, 64, 40.0, 4),                       # a cgroup quota of 4 on a 64-CPU node with 40 busy: the quota's 4
    (1, 2, 2, 0.0, 1),                         # two jobs side by side: auto's count caps it
    (8, 8, 8, 2.4, 6),                         # 5.6 free -> 6
])
def test_free_threads(base, cpus, affinity, others, expected):
    assert compute.free_threads(base, cpus, affinity, others) == expected


def test_measure_others_reads_this_machine():
    seen = compute.measure_others(0.05)
    if seen is None:
        pytest.skip("no /proc/stat here")
    others, affinity = seen
    assert affinity == len(os.sched_getaffinity(0)) and 0.0 <= others <= affinity + 0.5


# ----------------------------------------------------------------------------------------------- the wait policy
@pytest.mark.parametrize("setting,env,expected", [
    ("auto", {}, ("PASSIVE", "cprobe's default")),
    ("auto", {"OMP_WAIT_POLICY": "active"}, ("ACTIVE", "OMP_WAIT_POLICY in the environment")),
    ("auto", {"OMP_WAIT_POLICY": "PASSIVE"}, ("PASSIVE", "OMP_WAIT_POLICY in the environment")),
    ("active", {}, ("ACTIVE", "compute.wait_policy")),
    ("passive", {"OMP_WAIT_POLICY": "ACTIVE"}, ("PASSIVE", "compute.wait_policy")),  # the config beats the env
    # what auto chose at the run's start (set_wait_policy), for the job and the processes it starts
    ("auto", {"CPROBE_WAIT_AUTO": "default 0.2 2"},
     ("", "cprobe's default, quiet at the start: 0.2 of 2 CPU(s) busy with other work")),
    ("auto", {"CPROBE_WAIT_AUTO": "passive 1.0 2", "OMP_WAIT_POLICY": "PASSIVE"},
     ("PASSIVE", "cprobe's default, shared at the start: 1.0 of 2 CPU(s) busy with other work")),
    ("auto", {"CPROBE_WAIT_AUTO": "passive", "OMP_WAIT_POLICY": "PASSIVE"},
     ("PASSIVE", "cprobe's default, shared at the start: the load unreadable")),
    # a value set since (a SLURM task's export line) is the environment's, not the start's choice
    ("auto", {"CPROBE_WAIT_AUTO": "default 0.0 2", "OMP_WAIT_POLICY": "PASSIVE"},
     ("PASSIVE", "OMP_WAIT_POLICY in the environment")),
    ("auto", {"CPROBE_WAIT_AUTO": "passive 1.0 2"}, ("PASSIVE", "cprobe's default")),
])
def test_wanted_wait_policy(setting, env, expected):
    assert compute.wanted_wait_policy(setting, env) == expected


def test_a_bad_wait_policy_is_one_line():
    with pytest.raises(ConfigError, match=r"compute.wait_policy must be one of \['auto', 'passive', 'active'\], "
                                          "got 'spin'"):
        compute.wait_policy_setting({"wait_policy": "spin"})
    assert compute.wait_policy_setting({"wait_policy": "PASSIVE"}) == "passive"
    assert compute.wait_policy_setting({}) == "auto"
    with pytest.raises(ConfigError, match="OMP_WAIT_POLICY='sometimes' is neither PASSIVE nor ACTIVE"):
        compute.wanted_wait_policy("auto", {"OMP_WAIT_POLICY": "sometimes"})


@pytest.mark.parametrize("argv,env,set_to", [
    ([], {}, "PASSIVE"),  # cprobe's default
    (["run", "+experiment=x"], {"OMP_WAIT_POLICY": "ACTIVE"}, None),  # the user's environment decides
    (["run", "compute.wait_policy=active"], {}, "ACTIVE"),  # the command line, read before torch loads
    (["run", "++compute.wait_policy=passive"], {"OMP_WAIT_POLICY": "ACTIVE"}, "PASSIVE"),
    (["run", "+compute.wait_policy=auto"], {"OMP_WAIT_POLICY": "PASSIVE"}, None),
    (["run", "compute.wait_policy=spin"], {}, None),  # unknown: left to the job, which refuses it in one line
    (["run", "compute.wait_policy=active,passive"], {}, None),  # a sweep over it: each job checks its own
    ([], {"OMP_WAIT_POLICY": "bogus"}, None),  # a bad environment: the job refuses it in one line
])
def test_set_wait_policy_before_torch_loads(argv, env, set_to):
    before = dict(env)
    assert compute.set_wait_policy(argv, env, torch_loaded=False) == set_to
    assert env == (before if set_to is None else {**before, "OMP_WAIT_POLICY": set_to})


@pytest.mark.parametrize("seen,set_to,marker", [
    ((0.2, 2), None, "default 0.20 2"),  # quiet: OpenMP's default (spin, then sleep) stays
    ((0.49, 2), None, "default 0.49 2"),
    ((0.5, 2), "PASSIVE", "passive 0.50 2"),  # half a core busy with other work: passive
    ((1.0, 2), "PASSIVE", "passive 1.00 2"),
    (None, "PASSIVE", "passive"),  # the load unreadable (no /proc/stat): passive
])
def test_auto_reads_the_load_at_a_run_s_start(monkeypatch, seen, set_to, marker):
    monkeypatch.setattr(compute, "measure_others", lambda window=compute.FREE_WINDOW_S: seen)
    env: dict[str, str] = {}
    assert compute.set_wait_policy(["run", "+experiment=x"], env, torch_loaded=False) == set_to
    assert env == {"CPROBE_WAIT_AUTO": marker, **({} if set_to is None else {"OMP_WAIT_POLICY": set_to})}
    env = {}  # the library's run (no "run" in its overrides) measures too
    assert compute.set_wait_policy(["+experiment=x"], env, torch_loaded=False, measure=True) == set_to
    assert env["CPROBE_WAIT_AUTO"] == marker


def test_auto_measures_only_for_a_run_with_no_policy_set(monkeypatch):
    def never(window=0.0):
        raise AssertionError("measured")

    monkeypatch.setattr(compute, "measure_others", never)
    for argv, env in ((["cache", "info"], {}), ([], {}), (["run", "compute.wait_policy=passive"], {}),
                      (["run"], {"OMP_WAIT_POLICY": "ACTIVE"})):
        compute.set_wait_policy(argv, env, torch_loaded=False)
        assert "CPROBE_WAIT_AUTO" not in env
    env = {}
    assert compute.set_wait_policy(["run"], env, torch_loaded=False, measure=False) == "PASSIVE"


def test_set_wait_policy_does_nothing_once_torch_is_loaded():
    env: dict[str, str] = {}
    assert compute.set_wait_policy(["run", "compute.wait_policy=active"], env, torch_loaded=True) is None
    assert env == {}


def test_check_wait_policy():
    env: dict[str, str] = {}  # before torch loads, the job can still set it
    assert compute.check_wait_policy("active", env, torch_loaded=False) == ("ACTIVE", "compute.wait_policy")
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}
    env = {"OMP_WAIT_POLICY": "PASSIVE"}  # started with what the config asks for
    assert compute.check_wait_policy("passive", env, torch_loaded=True) == ("PASSIVE", "compute.wait_policy")
    assert compute.check_wait_policy("auto", env, torch_loaded=True) == ("PASSIVE", "OMP_WAIT_POLICY in the "
                                                                                   "environment")
    # torch loaded before cprobe could set it (a notebook): auto accepts OpenMP's default and says so
    assert compute.check_wait_policy("auto", {}, torch_loaded=True) == (
        "OpenMP default", "torch was loaded before cprobe could set OMP_WAIT_POLICY")
    with pytest.raises(ConfigError, match=r"compute.wait_policy=active cannot take effect: OpenMP started with "
                                          r"OMP_WAIT_POLICY=PASSIVE when torch loaded.*on the command line") as e:
        compute.check_wait_policy("active", {"OMP_WAIT_POLICY": "PASSIVE"}, torch_loaded=True)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"OpenMP started with OpenMP's default wait policy"):
        compute.check_wait_policy("passive", {}, torch_loaded=True)
    # auto kept OpenMP's default at a quiet start: the job runs under it and says why
    assert compute.check_wait_policy("auto", {"CPROBE_WAIT_AUTO": "default 0.1 2"}, torch_loaded=True) == (
        "OpenMP default", "cprobe's default, quiet at the start: 0.1 of 2 CPU(s) busy with other work")


def test_children_start_under_the_job_s_wait_policy(monkeypatch, clean_policy):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    compute._POLICY.clear()
    assert compute.child_env() == {"OMP_WAIT_POLICY": "PASSIVE"}
    compute._POLICY["wait_policy_setting"] = "active"
    assert compute.child_env() == {"OMP_WAIT_POLICY": "ACTIVE"}
    compute._POLICY["wait_policy_setting"] = "auto"
    monkeypatch.setenv("CPROBE_WAIT_AUTO", "default 0.0 2")  # quiet at the start: children inherit the default too
    assert compute.child_env() == {}


# ----------------------------------------------------------------------------------------------- applied
def _configure(monkeypatch, cfg, cpus=4, workers=1, env=None):
    monkeypatch.setattr(compute, "_usable", lambda env=None: (cpus, "affinity mask"))
    for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(k, raising=False)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    return compute.configure_process(workers, cfg)


def test_configure_process_applies_and_records_the_policy(monkeypatch, clean_policy):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    policy = _configure(monkeypatch, {}, cpus=4, workers=2, env={"OMP_WAIT_POLICY": "PASSIVE"})
    assert torch.get_num_threads() == 2
    assert policy.items() <= compute.thread_policy().items()  # and what following the load did so far
    assert {k: policy[k] for k in ("threads", "threads_from", "explicit", "wait_policy", "usable_cpus",
                                   "parallel_jobs")} == {
        "threads": 2, "threads_from": "4 usable CPU(s) / 2 parallel job(s)", "explicit": False,
        "wait_policy": "PASSIVE", "usable_cpus": 4, "parallel_jobs": 2}
    assert policy["small_fits"] == "1 below 1e+09 flops per op, else 2"
    assert compute.thread_budget() == 2


def test_compute_threads_is_honoured_by_every_op(monkeypatch, clean_policy):
    """compute.threads=N, like OMP_NUM_THREADS=N, runs the passes and every fit (small ones too) on N."""
    policy = _configure(monkeypatch, {"threads": 3}, env={"OMP_WAIT_POLICY": "PASSIVE"})
    assert torch.get_num_threads() == 3 and policy["threads_from"] == "compute.threads" and policy["explicit"]
    assert compute.fit_thread_count(1e3, torch.get_num_threads()) == 3
    with compute.fit_threads(1e3):
        assert torch.get_num_threads() == 3
    _configure(monkeypatch, {}, cpus=4, env={"OMP_WAIT_POLICY": "PASSIVE"})  # auto again: the size rule
    assert compute.fit_thread_count(1e3, torch.get_num_threads()) == 1
    with compute.fit_threads(1e3):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 4


def test_compute_threads_free_takes_the_cores_other_work_leaves(monkeypatch, clean_policy):
    """compute.threads=free: auto's count lowered to the free cores, the small-fit rule kept, the load recorded; where
    the load cannot be read, auto's count and a reason."""
    monkeypatch.setattr(compute, "measure_others", lambda window=compute.FREE_WINDOW_S: (1.0, 2))
    policy = _configure(monkeypatch, {"threads": "free"}, cpus=2,
                        env={"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"})  # free wins, as a count would
    assert torch.get_num_threads() == 1 and not policy["explicit"] and policy["others_busy_cores"] == 1.0
    assert policy["threads_from"] == ("compute.threads=free: 2 usable CPU(s) / 1 parallel job(s), 1.0 of 2 CPU(s) busy "
                                      "with other work at the job's start")
    monkeypatch.setattr(compute, "measure_others", lambda window=compute.FREE_WINDOW_S: (0.1, 2))
    assert _configure(monkeypatch, {"threads": "free"}, cpus=2, env={"OMP_WAIT_POLICY": "PASSIVE"})["threads"] == 2
    assert compute.fit_thread_count(1e3, torch.get_num_threads()) == 1
    monkeypatch.setattr(compute, "measure_others", lambda window=compute.FREE_WINDOW_S: None)
    policy = _configure(monkeypatch, {"threads": "free"}, cpus=4, workers=2, env={"OMP_WAIT_POLICY": "PASSIVE"})
    assert policy["threads"] == 2 and policy["threads_from"].endswith("the load unreadable here (no /proc/stat)")
    assert "others_busy_cores" not in policy


def test_a_wait_policy_that_cannot_take_effect_is_refused(monkeypatch, clean_policy):
    with pytest.raises(ConfigError, match="compute.wait_policy=active cannot take effect"):
        _configure(monkeypatch, {"wait_policy": "active"}, env={"OMP_WAIT_POLICY": "PASSIVE"})


def test_environment_json_records_the_policy(monkeypatch, tmp_path, clean_policy):
    import json

    from cprobe.report.environment import write_environment

    _configure(monkeypatch, {"threads": 1}, env={"OMP_WAIT_POLICY": "PASSIVE"})
    env = json.loads(write_environment(tmp_path, {"device": "cpu"}).read_text())
    assert env["thread_policy"]["threads"] == 1 == env["torch_threads"]
    assert env["thread_policy"]["threads_from"] == "compute.threads"
    assert env["thread_policy"]["wait_policy"] == "PASSIVE"
    assert env["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "GNU OpenMP (libgomp)" in env["openmp"]  # torch's pip wheels bundle libgomp


def test_openmp_runtimes_from_the_loaded_libraries():
    maps = ("7f0 r-xp 00 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1\n"
            "7f1 r-xp 00 08:01 2 /opt/intel/lib/libiomp5.so\n7f2 r-xp 00 08:01 3 /usr/lib/libc.so.6\n")
    assert compute.openmp_runtimes(maps) == ["GNU OpenMP (libgomp)", "Intel OpenMP (libiomp5)"]
    assert compute.openmp_runtimes("") == []


def test_the_new_compute_keys_at_their_defaults_keep_every_job_s_identity():
    old = {"compute": {"device": "cpu", "dtype": "float32"}, "seed": 0}
    new = {"compute": {"device": "cpu", "dtype": "float32", "resume": True, "kv_resume": True, "threads": "auto",
                       "wait_policy": "auto"}, "seed": 0}
    assert identity(new) == identity(old) == old
    assert identity({"compute": {"threads": 2}})["compute"] == {"threads": 2}
    assert identity({"compute": {"wait_policy": "active"}})["compute"] == {"wait_policy": "active"}


def test_slurm_tasks_start_under_the_driver_s_wait_policy():
    from cprobe.launch.slurm import task_setup

    assert task_setup(["module load x"], {"OMP_WAIT_POLICY": "PASSIVE"}) == ["export OMP_WAIT_POLICY=PASSIVE",
                                                                             "module load x"]
    assert task_setup(["module load x"], {}) == ["module load x"]
    # the driver's machine was quiet (auto kept OpenMP's default there): a node's load is not the driver's
    assert task_setup([], {"CPROBE_WAIT_AUTO": "default 0.0 2"}) == ["export OMP_WAIT_POLICY=PASSIVE"]


# ----------------------------------------------------------------------------------------------- following the load
@pytest.mark.parametrize("current,base,cpus,affinity,others,expected", [
    (2, 2, 2, 2, 1.0, 1),    # one core busy with other work: one thread
    (2, 2, 2, 2, 0.55, 2),   # 1.45 free: within the margin past the midpoint (1.5 - 0.1): stay
    (2, 2, 2, 2, 0.65, 1),   # 1.35 free: past it
    (1, 2, 2, 2, 0.45, 1),   # 1.55 free: back up only past 1.6
    (1, 2, 2, 2, 0.3, 2),
    (2, 2, 2, 2, 1.9, 1),    # never below one
    (1, 4, 4, 4, 0.0, 4),    # the load gone: the job's whole count at once
    (4, 4, 4, 4, 2.2, 2),    # 1.8 free: two
    (1, 2, 4, 4, 0.0, 2),    # never above the job's count (two jobs side by side on 4 CPUs)
])
def test_follow_count(current, base, cpus, affinity, others, expected):
    assert compute.follow_count(current, base, cpus, affinity, others) == expected


class Machine:
    """A fake clock and /proc/stat for follow_load: ``advance(seconds, others)`` lets ``others`` cores of other work
    and this job's passes (on the rest, at most its torch threads) run for ``seconds``."""

    def __init__(self, monkeypatch, cpus: int = 2) -> None:
        self.cpus, self.hz = cpus, float(os.sysconf("SC_CLK_TCK"))
        self.t, self.busy, self.total, self.own = 100.0, 0, 0, 0.0
        monkeypatch.setattr(compute, "_clock", lambda: self.t)
        monkeypatch.setattr(compute, "_reading", lambda: (self.t, (self.busy, self.total), self.own, self.cpus))
        monkeypatch.setattr(compute, "_OPEN", [0])  # outside the unit tests' one-thread block (tests/unit/conftest.py)

    def advance(self, seconds: float, others: float) -> None:
        own = min(self.cpus - others, float(torch.get_num_threads()))
        self.t += seconds
        self.busy += round((others + own) * self.hz * seconds)
        self.total += round(self.cpus * self.hz * seconds)
        self.own += own * seconds


def test_the_passes_threads_follow_the_load(monkeypatch, clean_policy):
    """auto: the passes drop to the cores other work leaves free and come back when it stops; the load is read at most
    once a second, a stale reading only starts a new window; the seconds at each count are recorded."""
    m = Machine(monkeypatch)
    policy = _configure(monkeypatch, {}, cpus=2, env={"OMP_WAIT_POLICY": "ACTIVE"})
    assert policy["follow_load"] is True and policy["follow_base"] == 2 and torch.get_num_threads() == 2
    assert policy["follow_load_from"] == "at a pass's start, at most every 1 s: the cores other work leaves free, 1 to 2"
    m.advance(1.0, 1.0)
    assert compute.follow_load() == 1 and torch.get_num_threads() == 1  # a neighbour took a core
    m.advance(1.0, 1.0)
    assert compute.follow_load() is None and torch.get_num_threads() == 1  # still there
    m.advance(1.0, 0.0)
    assert compute.follow_load() == 2 and torch.get_num_threads() == 2  # gone
    m.advance(0.5, 1.0)
    assert compute.follow_load() is None  # half a second: not read
    m.advance(0.4, 1.0)
    assert compute.follow_load() is None  # read 0.9 s after the last reading: still not
    m.advance(0.2, 1.0)
    assert compute.follow_load() == 1  # 1.1 s of a busy neighbour
    m.advance(10.0, 0.0)
    assert compute.follow_load() is None and torch.get_num_threads() == 1  # a stale window: a new start only
    m.advance(1.0, 0.0)
    assert compute.follow_load() == 2
    m.advance(2.0, 0.0)
    assert compute.thread_policy()["seconds_at_threads"] == {"2": 1.0 + 1.1 + 2.0, "1": 2.0 + 11.0}
    assert compute.thread_policy()["thread_changes"] == 4


def test_the_record_counts_from_the_job_s_start_to_the_record(monkeypatch, clean_policy):
    m = Machine(monkeypatch)
    _configure(monkeypatch, {}, cpus=2, env={"OMP_WAIT_POLICY": "ACTIVE"})
    m.advance(3.5, 0.0)
    assert compute.thread_policy()["seconds_at_threads"] == {"2": 3.5} and compute.thread_policy()["thread_changes"] == 0


def test_a_block_s_count_and_a_fit_s_count_do_not_follow_the_load(monkeypatch, clean_policy):
    """Inside a threads() block the block's count stands; a fit takes the job's count, not the passes' of the moment
    (its float sums do not depend on the load), and the passes' count comes back after it."""
    m = Machine(monkeypatch)
    _configure(monkeypatch, {}, cpus=2, env={"OMP_WAIT_POLICY": "ACTIVE"})
    m.advance(1.0, 1.0)
    assert compute.follow_load() == 1
    with compute.fit_threads(1e12):  # a large fit: the job's count
        assert torch.get_num_threads() == 2
        m.advance(1.0, 0.0)
        assert compute.follow_load() is None and torch.get_num_threads() == 2
        with compute.fit_threads(1e12):  # nested: the enclosing block's count
            assert torch.get_num_threads() == 2
    with compute.fit_threads(1e3):  # a small one: one thread, as always
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("cfg,env,why", [
    ({"threads": 2}, {}, "the count is fixed (compute.threads)"),
    ({}, {"OMP_NUM_THREADS": "2"}, "the count is fixed (OMP_NUM_THREADS)"),
    ({"follow_load": False}, {}, "compute.follow_load=false"),
])
def test_a_fixed_count_never_follows_the_load(monkeypatch, clean_policy, cfg, env, why):
    m = Machine(monkeypatch)
    policy = _configure(monkeypatch, cfg, cpus=2, env={"OMP_WAIT_POLICY": "ACTIVE", **env})
    assert policy["follow_load"] is False and policy["follow_load_from"] == why and "follow_base" not in policy
    m.advance(1.0, 1.0)
    assert compute.follow_load() is None and torch.get_num_threads() == 2
    assert "seconds_at_threads" not in compute.thread_policy()


def test_one_thread_has_nothing_to_lower(monkeypatch, clean_policy):
    policy = _configure(monkeypatch, {}, cpus=2, workers=2, env={"OMP_WAIT_POLICY": "ACTIVE"})
    assert policy["follow_load"] is False and policy["follow_load_from"] == "one thread: nothing to lower"


def test_free_starts_lowered_and_follows_back_up_while_openmp_spins(monkeypatch, clean_policy):
    monkeypatch.setattr(compute, "measure_others", lambda window=compute.FREE_WINDOW_S: (1.0, 2))
    m = Machine(monkeypatch)
    policy = _configure(monkeypatch, {"threads": "free"}, cpus=2, env={"OMP_WAIT_POLICY": "ACTIVE"})
    assert torch.get_num_threads() == 1 and policy["follow_base"] == 2
    m.advance(1.0, 0.0)
    assert compute.follow_load() == 2


@pytest.mark.parametrize("cfg", [{}, {"threads": "free"}])
def test_passive_threads_keep_their_count(monkeypatch, clean_policy, cfg):
    """A job whose OpenMP threads sleep at a barrier (passive: started beside other work, a SLURM task) keeps its count:
    passive threads lose little on a shared core (docs/performance.md, "A shared CPU")."""
    monkeypatch.setattr(compute, "measure_others", lambda window=compute.FREE_WINDOW_S: (1.0, 2))
    m = Machine(monkeypatch)
    policy = _configure(monkeypatch, cfg, cpus=2, env={"OMP_WAIT_POLICY": "PASSIVE"})
    assert policy["follow_load"] is False
    assert policy["follow_load_from"] == "OpenMP's threads sleep at a barrier (passive): a shared core costs them little"
    before = torch.get_num_threads()
    for others in (1.0, 0.0):
        m.advance(1.0, others)
        assert compute.follow_load() is None and torch.get_num_threads() == before


def test_a_quiet_start_follows(monkeypatch, clean_policy):
    """auto's quiet start (OpenMP's default wait, recorded in CPROBE_WAIT_AUTO) is what following is for."""
    m = Machine(monkeypatch)
    policy = _configure(monkeypatch, {}, cpus=2, env={"CPROBE_WAIT_AUTO": "default 0.02 2"})
    assert policy["wait_policy"] == "OpenMP default" and policy["follow_load"] is True
    m.advance(1.0, 1.0)
    assert compute.follow_load() == 1


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_follow_load_is_one_line(value):
    with pytest.raises(ConfigError, match=r"^compute.follow_load must be true or false, got") as e:
        compute.check_threads({"follow_load": value})
    assert "\n" not in str(e.value)


def test_an_unreadable_load_stops_following(monkeypatch, clean_policy):
    _configure(monkeypatch, {}, cpus=2, env={"OMP_WAIT_POLICY": "ACTIVE"})
    monkeypatch.setattr(compute, "_reading", lambda: None)
    monkeypatch.setattr(compute, "FOLLOW_S", 0.0)
    monkeypatch.setattr(compute, "_OPEN", [0])
    assert compute.follow_load() is None and torch.get_num_threads() == 2
    assert compute.thread_policy()["follow_load"] is False
    assert compute.thread_policy()["follow_load_from"] == "the load unreadable here (no /proc/stat)"


def test_every_model_pass_reads_the_load_first(monkeypatch):
    """ModelAdapter.run and the clean-state pass call follow_load before the model runs."""
    import cprobe.models.adapter as adapter_mod
    import cprobe.models.resume as resume_mod
    from cprobe.models.formatters import RegionFormatter
    from cprobe.models.resume import CleanStates
    from tests.conftest import make_random_model

    model, tok = make_random_model("gpt_neox")
    ad = adapter_mod.ModelAdapter(model, tok, "causal", "neox", batch_size=2)
    calls = []
    monkeypatch.setattr(adapter_mod, "follow_load", lambda: calls.append("run"))
    monkeypatch.setattr(resume_mod, "follow_load", lambda: calls.append("clean"))
    from cprobe.data.items import TextItem

    items = [TextItem("a", "the cat sat", regions=("the cat", " sat")),
             TextItem("b", "a dog ran far", regions=("a dog", " ran far"))]
    batch = RegionFormatter()(items, ad, torch.arange(2))
    ad.run(batch)
    assert calls == ["run"]
    clean = ad.clean_states(batch, [1])
    assert isinstance(clean, CleanStates)
    clean.take(torch.arange(2), batch.input_ids, batch.attention_mask, ad.name, ad.device, [1])
    assert "clean" in calls


@pytest.mark.numeric
def test_a_pass_computes_the_same_on_one_thread_and_on_two():
    """What lets the passes follow the load: the same forward and backward on 1 and 2 threads (bitwise on the CPUs
    measured; here within float32 rounding, as another CPU's kernels may split a sum differently)."""
    from tests.conftest import make_random_model

    model, _ = make_random_model("gemma3_text")
    ids = torch.randint(3, model.config.vocab_size, (4, 9), generator=torch.Generator().manual_seed(0))
    before, out = torch.get_num_threads(), {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            x = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            h = model(inputs_embeds=x).logits[:, -1]
            h.square().sum().backward()
            out[n] = (h.detach(), x.grad)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out[1][0], out[2][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[1][1], out[2][1], rtol=1e-5, atol=1e-6)


def test_the_follow_load_key_at_its_default_keeps_every_job_s_identity():
    assert identity({"compute": {"device": "cpu", "follow_load": True}}) == {"compute": {"device": "cpu"}}
    assert identity({"compute": {"follow_load": False}})["compute"] == {"follow_load": False}


def test_environment_json_records_the_job_s_count_and_what_following_did(monkeypatch, tmp_path, clean_policy):
    import json

    from cprobe.report.environment import write_environment

    m = Machine(monkeypatch)
    _configure(monkeypatch, {}, cpus=2, env={"OMP_WAIT_POLICY": "ACTIVE"})
    m.advance(1.0, 1.0)
    assert compute.follow_load() == 1
    m.advance(2.0, 1.0)
    env = json.loads(write_environment(tmp_path, {"device": "cpu"}).read_text())
    assert env["torch_threads"] == 2 == env["thread_policy"]["threads"]  # the job's count, not the passes' now
    assert env["thread_policy"]["seconds_at_threads"] == {"2": 1.0, "1": 2.0}
    assert env["thread_policy"]["follow_load"] is True and env["thread_policy"]["thread_changes"] == 1
