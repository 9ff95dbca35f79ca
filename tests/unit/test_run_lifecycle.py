"""The run lifecycle: a directory per run, the running process recorded and a dead one detected."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cprobe.job import describe_state, process_gone, this_process, write_status


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_running_status_whose_process_is_gone_reads_as_dead():
    me = {"state": "running", **this_process()}
    assert me["pid"] == os.getpid() and me["host"] == socket.gethostname()
    assert not process_gone(me) and describe_state(me).startswith(f"running (pid {os.getpid()} on ")
    dead = {**me, "pid": _dead_pid(), "pid_start": None}
    assert process_gone(dead) and describe_state(dead).startswith("dead (its process")
    if me["pid_start"] is not None:  # Linux: a reused pid names another process
        assert process_gone({**me, "pid_start": str(int(me["pid_start"]) - 1)})
    assert not process_gone({**dead, "host": "another-host"})  # cannot be checked from here: still running
    assert not process_gone({"state": "running"})  # written by an older cprobe: no pid to check
    assert not process_gone({**dead, "state": "done"})


def test_collect_names_a_killed_job_dead(tmp_path):
    from cprobe.errors import CprobeError
    from cprobe.pipeline import collect
    from cprobe.results import write_table

    done = tmp_path / "seed=0"
    write_table(pd.DataFrame({"task": ["probing"], "accuracy": [1.0]}), done / "metrics")
    write_status(done, state="done")
    write_status(tmp_path / "seed=1", state="running", **{**this_process(), "pid": _dead_pid(), "pid_start": None})
    with pytest.raises(CprobeError, match=r"seed=1 is dead \(its process \d+ on .* is gone, killed while running"):
        collect(tmp_path)


def test_sigterm_inside_a_job_is_an_interrupt_and_the_handler_is_restored():
    import signal

    from cprobe.errors import Terminated
    from cprobe.pipeline import sigterm_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
    assert issubclass(Terminated, KeyboardInterrupt)  # every `except KeyboardInterrupt` path handles it


@pytest.mark.parametrize("where", ["__del__", "weakref.finalize"])
def test_sigterm_during_a_finaliser_still_ends_the_job(where):
    """Python prints and drops an exception raised inside a finaliser (``__del__``, a ``weakref.finalize`` callback:
    a garbage collection can run one anywhere): a SIGTERM that lands there is taken again once the finaliser is over,
    not lost (the suite saw a job run on); an exception of the user's in a finaliser is reported as before."""
    import signal
    import sys
    import time
    import weakref

    from cprobe.errors import Terminated
    from cprobe.pipeline import sigterm_as_interrupt

    def finaliser():
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # the handler runs here, inside the finaliser

    class Finalised:
        def __del__(self):
            finaliser()

    class Plain:
        pass

    hook = sys.unraisablehook
    with pytest.raises(Terminated), sigterm_as_interrupt():
        if where == "__del__":
            Finalised()
        else:
            obj = Plain()
            weakref.finalize(obj, finaliser)
            del obj
        time.sleep(5)  # the signal comes again here
    assert sys.unraisablehook is hook


def _composed():
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    import cprobe.pipeline  # noqa: F401  (registers the resolvers the configs use)
    from cprobe.paths import config_dir

    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return compose("config", overrides=["+experiment=sva_tiny"], return_hydra_config=True), HydraConfig


def test_two_runs_started_in_the_same_second_get_a_directory_each(tmp_path):
    from omegaconf import open_dict, read_write  # noqa: F401

    from cprobe.callbacks import AggregateResults
    from cprobe.paths import LATEST

    cfg, hc = _composed()
    with open_dict(cfg):
        cfg.paths.output_root = str(tmp_path)
    hc.instance().set_config(cfg)
    other = copy.deepcopy(cfg)  # the same time stamp, as two processes started in the same second see it
    AggregateResults().on_run_start(cfg)
    AggregateResults().on_run_start(other)
    a, b = Path(cfg.hydra.run.dir), Path(other.hydra.run.dir)
    assert a != b and b.name == a.name + "_2" and a.is_dir() and b.is_dir()
    assert (a.parent / LATEST).resolve() == b.resolve()
    # a directory given on the command line is the user's choice (rerun, resume): never renamed
    with read_write(other.hydra.run):
        other.hydra.run.dir = str(a)
    AggregateResults().on_run_start(other)
    assert Path(other.hydra.run.dir) == a


def test_two_sweeps_started_in_the_same_second_get_a_directory_each(tmp_path):
    from omegaconf import open_dict

    from cprobe.callbacks import AggregateResults

    cfg, hc = _composed()
    with open_dict(cfg):
        cfg.paths.output_root = str(tmp_path)
    hc.instance().set_config(cfg)
    other = copy.deepcopy(cfg)
    AggregateResults().on_multirun_start(cfg)
    AggregateResults().on_multirun_start(other)
    a, b = Path(cfg.hydra.sweep.dir), Path(other.hydra.sweep.dir)
    assert b.name == a.name + "_2"
    # every job of the second sweep is composed again from the hydra overrides: they pin its directory
    assert other.hydra.overrides.hydra[-1] == f"hydra.sweep.dir='{b}'"


def test_status_json_of_a_running_job_records_its_process(tmp_path):
    write_status(tmp_path, state="running", **this_process())
    s = json.loads((tmp_path / "status.json").read_text())
    assert {"pid", "host", "pid_start"} <= set(s)


@pytest.mark.parametrize("text,expected", [
    ("../../../../../escaped", "_.._.._.._.._escaped"), ("EleutherAI/pythia-70m", "EleutherAI_pythia-70m"),
    ("..", "_"), (".hidden", "hidden"), ("a b\\c", "a_b_c"), ("probe=mlp,seed=3", "probe=mlp,seed=3"),
    ("layers=[2,4]", "layers=[2,4]"), ("word:2", "word:2"), ("", "_"),
])
def test_safe_name_keeps_a_name_one_path_component(text, expected):
    from cprobe.paths import safe_name

    assert safe_name(text) == expected
    assert "/" not in safe_name(text) and safe_name(text) not in (".", "..")


def test_safe_name_cuts_long_names_with_a_stable_hash_and_plain_name_refuses_paths():
    from cprobe.errors import ConfigError
    from cprobe.paths import plain_name, safe_name

    long = "x" * 300
    assert len(safe_name(long)) == 120 and safe_name(long) == safe_name(long) != safe_name(long + "y")
    assert plain_name("gpt2", "model") == "gpt2"
    with pytest.raises(ConfigError, match=r"model='\.\./x' must be a plain name"):
        plain_name("../x", "model")


def test_environ_sets_values_for_the_block_and_restores_set_and_unset_ones(monkeypatch):
    import os

    from cprobe.paths import environ

    monkeypatch.setenv("CPROBE_T_SET", "before")
    monkeypatch.delenv("CPROBE_T_UNSET", raising=False)
    with pytest.raises(RuntimeError):
        with environ(CPROBE_T_SET="1", CPROBE_T_UNSET="2"):
            assert (os.environ["CPROBE_T_SET"], os.environ["CPROBE_T_UNSET"]) == ("1", "2")
            raise RuntimeError  # restored on the way out of a failing block too
    assert os.environ["CPROBE_T_SET"] == "before" and "CPROBE_T_UNSET" not in os.environ


def test_group_config_reads_a_named_yaml_resolved_and_names_the_setting_when_unknown():
    from cprobe.errors import ConfigError
    from cprobe.paths import group_config

    cfg = group_config("model", "tiny_bert_sva")
    assert cfg["name"] == "tiny_bert_sva" and "${" not in repr(cfg)
    with pytest.raises(ConfigError, match=r"^unknown model 'nope'; choose from \[.*'tiny_bert_sva'"):
        group_config("model", "nope")
    with pytest.raises(ConfigError, match=r"^unknown model config 'nope' for liberty.st_model; choose from \["):
        group_config("model", "nope", "liberty.st_model")
    with pytest.raises(ConfigError, match=r"liberty.st_model='../x' must be a plain name"):
        group_config("model", "../x", "liberty.st_model")


def test_relative_names_a_job_under_its_root_and_the_root_itself_as_dot(tmp_path):
    from cprobe.paths import relative

    assert relative(tmp_path / "a" / "seed=1", tmp_path) == "a/seed=1"
    assert relative(tmp_path, tmp_path) == "."


def test_an_experiment_name_that_looks_like_a_path_stays_under_the_output_root(tmp_path):
    from omegaconf import open_dict

    from cprobe.callbacks import AggregateResults

    cfg, hc = _composed()
    with open_dict(cfg):
        cfg.paths.output_root = str(tmp_path / "out")
        cfg.name = "../../../../escaped"
    hc.instance().set_config(cfg)
    AggregateResults().on_run_start(cfg)
    run = Path(cfg.hydra.run.dir).resolve()
    assert run.is_relative_to((tmp_path / "out" / "runs").resolve()) and run.parent.name == "_.._.._.._escaped"


def test_report_files_named_after_config_strings_stay_in_the_output_dir(tmp_path):
    from cprobe.tasks.cebab import report as cebab_report
    from cprobe.tasks.liberty import _plot_sensitivity

    rows = [{"kind": "icace_error", "model": "../../../../escaped", "cebab_task": "5way", "train_variant": "exclusive",
             "eval_split": "test", "explainer": "random", "distance": "l2", "aspect": "all", "direction": "all",
             "value": 0.5, "n": 10, "seed": 0, "split": "", "metric": "icace_error"}]
    out = tmp_path / "a" / "b" / "run"
    cebab_report(pd.DataFrame(rows), out)
    sens = pd.DataFrame({"scm": ["../../escaped"] * 2, "model": ["m"] * 2, "explainer": ["model", "scm"],
                         "concept": ["a", "a"], "mean": [0.1, 0.2]})
    tab = pd.DataFrame({"scm": ["../../escaped"], "model": ["m"], "kind": ["sensitivity"], "concept": ["a"],
                        "n": [4], "seed": [0]})
    _plot_sensitivity(sens, out, tab)
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert all(w.startswith("a/b/run/") and w.count("/") == 3 for w in written), written
    assert "a/b/run/liberty_sensitivity__.._escaped.png" in written


def test_the_job_hash_ignores_the_trackers_so_the_slurm_driver_sees_a_finished_point_as_done(tmp_path):
    """The job hashes its config after dropping ``logger``; the SLURM driver hashes the composed config with it. Both
    go through ``job_hash``, which must drop it (a rerun of a sweep resubmitted every finished point before)."""
    from cprobe.pipeline import is_done, job_hash

    plain = {"task": "probing", "seed": 0, "layers": [2], "logger": {"csv": {}}, "progress": True}
    assert job_hash(plain) == job_hash({k: v for k, v in plain.items() if k != "logger"})
    assert job_hash(plain) != job_hash({**plain, "seed": 1})
    (tmp_path / "status.json").write_text(json.dumps({"state": "done", "config_hash": job_hash(
        {k: v for k, v in plain.items() if k != "logger"})}))
    assert is_done(plain, tmp_path) and not is_done({**plain, "seed": 1}, tmp_path)
