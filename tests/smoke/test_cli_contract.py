"""The CLI contract: Hydra overrides pass through `cprobe run`, errors are one line with exit code 1.

Most commands run in process (``tests.cli.run``: the Typer app the console script calls, the same code path); the
console script itself is launched only where a process is the point: a bad input's exit code and stderr as a shell
sees them, start-up time and imports, Ctrl-C, SIGTERM and SIGKILL."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cprobe import _hydra
from cprobe.cli import app
from tests.cli import REPO, assert_refused, launch, start
from tests.cli import run as cli

runner = CliRunner()


def test_normalise_bare_experiment():
    argv, notes = _hydra.normalise(["experiment=sva_tiny", "model=x"])
    assert argv == ["+experiment=sva_tiny", "model=x"] and len(notes) == 1
    assert _hydra.normalise(["+experiment=a"]) == (["+experiment=a"], [])


def test_cfg_job_prints_composed_config():
    r = cli("run", "+experiment=sva_tiny", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    assert "name: sva_tiny" in r.stdout and "tiny_bert_sva" in r.stdout


def test_cfg_job_is_resolved_by_default_and_raw_on_request():
    """`--cfg job` prints the config exactly as it will run: `device: auto`, not `device: ${compute.device}`."""
    import yaml

    r = cli("run", "+experiment=sva_tiny", "--cfg", "job", cwd=REPO)
    assert r.returncode == 0 and "${" not in r.stdout, r.stdout
    cfg = yaml.safe_load(r.stdout)
    assert cfg["device"] == "auto" and cfg["model"]["dtype"] == "float32" and cfg["paths"]["root_dir"] == str(REPO)
    r = cli("run", "+experiment=sva_tiny", "-c", "all")
    assert r.returncode == 0 and "${" not in r.stdout
    r = cli("run", "+experiment=sva_tiny", "--cfg", "job", "--raw")
    assert r.returncode == 0 and "device: ${compute.device}" in r.stdout
    assert _hydra.normalise(["--cfg", "job"]) == (["--cfg", "job", "--resolve"], [])
    assert _hydra.normalise(["--cfg", "hydra"]) == (["--cfg", "hydra"], [])  # the hydra node alone cannot resolve


def test_overrides_on_both_sides_of_multirun_flag():
    """Hydra 1.3's own parse_args rejects `a -m b c`; the intermixed parse keeps every override."""
    from hydra._internal.utils import get_args_parser

    argv = ["+experiment=sva_tiny", "-m", "probe=linear,mlp", "seed=3"]
    with pytest.raises(SystemExit):
        get_args_parser().parse_args(argv)
    args, _ = _hydra.parse_argv(argv)
    assert args.multirun and args.overrides == ["+experiment=sva_tiny", "probe=linear,mlp", "seed=3"]
    args, _ = _hydra.parse_argv(["a=1", "--cfg", "job", "b=2"])
    assert args.cfg == "job" and args.overrides == ["a=1", "b=2"]


def test_bare_experiment_is_accepted():
    r = cli("run", "experiment=sva_tiny", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    assert "treating 'experiment=sva_tiny' as '+experiment=sva_tiny'" in r.stderr


BAD_INPUTS = [
    (["model=nope"], "nope"),
    (["no_such_key=1"], "no_such_key"),
    (["+layer=2"], "unknown config key(s) ['layer']; known keys:"),
    (["seed=-1"], "seed must be a non-negative integer"),
    (["seed=abc"], "seed must be an integer, got 'abc'"),
    (["model.batch_size=0"], "model.batch_size must be >= 1"),
    (["layers=[]"], "layers=[] selects no layer"),
    (["layers=9"], "out of range: this model has layers 0 (embeddings) … 4"),
    (["position=word:x"], "unknown position rule 'word:x'"),
    (["device=tpu"], "unknown device 'tpu'"),
    (["model.dtype=float16"], "model.dtype='float16' is not one of"),
    (["probe.linear.lrs=[-0.1]"], "lrs values must be positive numbers"),
    (["+probing.propertys=[z_c]"], "unknown key(s) ['propertys'] under probing"),
    (["split.fractions.train=0.9"], "split fractions must be positive numbers summing to 1"),
    # found only after the run directory existed, which they left behind as `failed` (issue 25)
    (["+dataset.max_examples=-5"], "dataset.max_examples must be >= 1 (or null for all), got -5"),
    (["probing.properties=[z_c,z_x]"], "probing.properties: unknown property ['z_x'] for dataset 'synthetic_sva'; "
                                       "it has ['z_c', 'z_e', 'n_attractors', 'structure']"),
    pytest.param(["device=cuda"], "device=cuda but no CUDA device is available",
                 marks=pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")),
    pytest.param(["compute=gpu"], "device=cuda but no CUDA device is available",
                 marks=pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")),
]


@pytest.mark.parametrize("args,needle", [
    *BAD_INPUTS,
    (["task=reliability", "intervention=pgd", "intervention.eps=-1"], "eps must be a finite number > 0"),
    (["task=reliability", "intervention=inlp", "intervention.rank=-1"], "rank must be a non-negative integer"),
    (["task=reliability", "intervention=inlp", "+reliability.others=[z_q]"], "unknown property ['z_q']"),
])
def test_bad_input_is_one_line_exit_1_and_leaves_no_run_dir(tmp_path, args, needle):
    """In process: Hydra makes the run dir, validation refuses the job, the run dir goes, one line is printed."""
    extra = ["split=reliability", "probe=all"] if "task=reliability" in args else []
    r = cli("run", "+experiment=sva_tiny", *args, *extra, f"paths.output_root={tmp_path}")
    assert_refused(r, needle, tmp_path)


def test_the_console_script_refuses_bad_input_in_one_line_with_exit_1_and_no_run_dir(tmp_path):
    """The same contract as a shell sees it: a validation error (the run dir made, then removed) and a Hydra
    composition error (an unknown experiment: before any run dir), each one line on stderr, exit code 1."""
    r = launch("run", "+experiment=sva_tiny", "model.batch_size=0", f"paths.output_root={tmp_path}", timeout=300)
    assert_refused(r, "model.batch_size must be >= 1", tmp_path)
    assert not list(tmp_path.rglob("status.json")) and not (tmp_path / "runs" / "sva_tiny").exists()


def _spin_counts(stderr: str) -> set[str]:
    """What each GNU OpenMP runtime loaded read for its wait policy, as ``OMP_DISPLAY_ENV=VERBOSE`` prints it at
    start: a spin count of 0 is passive, 30,000,000,000 active, 300,000 libgomp's default (unset)."""
    return set(re.findall(r"GOMP_SPINCOUNT = '(\d+)'", stderr))


def test_the_console_script_sets_the_wait_policy_before_torch_loads(tmp_path):
    """OpenMP reads OMP_WAIT_POLICY once, when torch loads: the console script sets it first (passive by default),
    and reads compute.wait_policy from the command line to do so; a value that cannot take effect is refused."""
    display = {"OMP_DISPLAY_ENV": "VERBOSE", "OMP_WAIT_POLICY": None, "CPROBE_CACHE_DIR": str(tmp_path / "cache")}
    r = launch("cache", "info", env=display)  # loads torch
    assert r.returncode == 0 and _spin_counts(r.stderr) == {"0"}, r.stderr[-2000:]
    r = launch("run", "+experiment=sva_tiny", "compute.wait_policy=active", "model.batch_size=0",
               f"paths.output_root={tmp_path}", env=display, timeout=300)
    assert r.returncode == 1 and "model.batch_size must be >= 1" in r.stderr, r.stderr[-2000:]
    assert _spin_counts(r.stderr) == {"30000000000"}  # the command line's value, before torch loaded
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args,needle", [
    (["compute.threads=0"], "compute.threads must be auto, free or a positive integer, got 0"),
    (["compute.wait_policy=spin"], "compute.wait_policy must be one of ['auto', 'passive', 'active'], got 'spin'"),
    # in this process torch loaded long before the job: another wait policy can no longer take effect
    (["compute.wait_policy=active"], "compute.wait_policy=active cannot take effect: OpenMP started with"),
])
def test_thread_settings_are_checked_before_any_work(tmp_path, args, needle):
    r = cli("run", "+experiment=sva_tiny", *args, f"paths.output_root={tmp_path}", env={"OMP_WAIT_POLICY": "PASSIVE"})
    assert_refused(r, needle, tmp_path)


def test_an_in_process_run_leaves_the_test_process_as_it_was(tmp_path, monkeypatch):
    """tests.cli.run restores what a job changes in its process (cwd, root logger handlers and level, torch threads,
    Hydra's global instance, the environment it was given, the process-wide metric table) and empties the job's process-wide memos before and
    after, as in a new process: a model loaded under one test's cache root never serves another's."""
    import logging
    import os

    import torch
    from hydra.core.global_hydra import GlobalHydra

    import cprobe.job
    import cprobe.tasks.sites as rel
    from cprobe.metrics.registry import METRICS
    from tests import cli as helper

    monkeypatch.delenv("CPROBE_TEST_MARK", raising=False)
    cprobe.job._ADAPTER["stale"] = object()
    rel._MEMO["stale"] = object()  # type: ignore[assignment]
    root = logging.getLogger()
    before = (os.getcwd(), root.handlers[:], root.level, torch.get_num_threads(), list(sys.path))
    metrics = dict(METRICS)
    seen = {}

    real = helper._clear_process_memos

    def spy() -> None:
        real()
        if "first" not in seen:
            seen["first"] = (dict(cprobe.job._ADAPTER), dict(rel._MEMO), os.environ.get("CPROBE_TEST_MARK"))
            cprobe.job._ADAPTER["loaded by the job"] = object()  # as a job that loads its model leaves it
        else:  # after the job, before the tables are given back
            METRICS["resolved_by_the_job"] = object()  # as a job that resolves a plugin's metric leaves it

    monkeypatch.setattr(helper, "_clear_process_memos", spy)
    r = cli("run", "+experiment=sva_tiny", "--smoke", "layers=[]", f"paths.output_root={tmp_path}", cwd=tmp_path,
            env={"CPROBE_TEST_MARK": "1"})
    assert_refused(r, "layers=[] selects no layer", tmp_path)  # the job composed, set up its logging, refused
    assert seen["first"] == ({}, {}, None)  # emptied before the job (and before its environment was set)
    assert cprobe.job._ADAPTER == {} and rel._MEMO == {} and METRICS == metrics  # the built-ins only, as before
    assert (os.getcwd(), root.handlers, root.level, torch.get_num_threads(), sys.path) == before
    assert not GlobalHydra.instance().is_initialized() and "CPROBE_TEST_MARK" not in os.environ


def test_unknown_experiment_is_one_line():
    r = cli("run", "+experiment=does_not_exist")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "does_not_exist" in r.stderr


@pytest.mark.parametrize("args,expected", [
    (["model=nope"], "error: unknown model 'nope'; choose from ['bert_base_uncased', "),
    (["+sweep=nope"], "error: unknown sweep 'nope'; choose from ['causalgym_interventions', 'causalgym_methods', "),
    (["hydra/launcher=nope"], "error: unknown hydra/launcher 'nope'; choose from ['basic', "),
    (["nope=1"], "error: unknown config key 'nope': `nope=...` changes an existing key, `+nope=...` adds one, "
                 "`++nope=...` sets it either way"),
])
def test_unknown_option_is_one_short_line_with_the_valid_options(args, expected):
    """Hydra's own message ran to 300-700 characters with its config search path."""
    r = cli("run", "+experiment=sva_tiny", *args)
    assert r.returncode == 1 and r.stderr.startswith(expected), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "search path" not in r.stderr and "provider=" not in r.stderr
    assert len(r.stderr) < 600, len(r.stderr)  # the list of valid names is most of it


def test_run_without_arguments_prints_help():
    r = cli("run")
    assert r.returncode == 2 and "Usage" in r.stdout and "nothing to run" in r.stderr


def test_info_passes_through():
    r = cli("run", "--info", "searchpath", cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert str(REPO / "conf") in r.stdout


def test_help_and_list_are_fast_and_light():
    code = ("import sys, time; t=time.perf_counter(); from cprobe.cli import app; "
            "print(time.perf_counter()-t, 'torch' in sys.modules, 'transformers' in sys.modules, 'hydra' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1:] == ["False", "False", "False"]
    t0 = time.perf_counter()
    assert launch("list", timeout=300).returncode == 0
    assert launch("--help", timeout=300).returncode == 0
    assert (time.perf_counter() - t0) / 2 < 3.0  # generous for a loaded CI box; typically ~0.3 s each


def test_list_groups_and_unknown_group():
    r = runner.invoke(app, ["list", "model"])
    assert r.exit_code == 0 and "tiny_bert_sva" in r.output and "minilm_l6" in r.output
    r = runner.invoke(app, ["list", "nope"])
    assert r.exit_code == 1 and "unknown config group" in r.output


def test_version_and_data():
    r = runner.invoke(app, ["version"])
    assert r.exit_code == 0 and "cprobe" in r.output and "torch" in r.output
    r = runner.invoke(app, ["data"])
    assert r.exit_code == 0 and "lgd" in r.output and "get it:" in r.output


def test_collect_on_missing_dir_is_one_line(tmp_path):
    r = runner.invoke(app, ["collect", str(tmp_path / "nope")])
    assert r.exit_code == 1 and "not a directory" in r.output
    r = runner.invoke(app, ["collect", str(tmp_path)])
    assert r.exit_code == 1 and "no finished job" in r.output


def test_cache_info_and_clear(tmp_path):
    import torch

    from tests.conftest import write_activations

    env = {"CPROBE_CACHE_DIR": str(tmp_path)}
    entry = write_activations(tmp_path, {"model": "m"}, {"L0": torch.zeros(4, 3)}).dir  # an entry cprobe wrote
    (tmp_path / "activations" / "readme.txt").write_text("mine")  # a file it did not
    r = runner.invoke(app, ["cache", "info"], env=env)
    assert r.exit_code == 0 and entry.name in r.output and "readme.txt" in r.output and "keeps it" in r.output
    r = runner.invoke(app, ["cache", "clear", "activations", "--yes"], env=env)
    assert r.exit_code == 0 and "removed 1 entries" in r.output, r.output
    assert "kept 1 file(s) cprobe did not write: activations/readme.txt" in r.output
    assert not entry.exists() and (tmp_path / "activations" / "readme.txt").is_file()
    r = runner.invoke(app, ["cache", "clear", "bogus", "--yes"], env=env)
    assert r.exit_code == 1


@pytest.mark.parametrize("launcher,target", [
    ("local_parallel", "JoblibLauncher"), ("slurm", "SlurmLauncher"), ("submitit_local", "LocalLauncher"),
])
def test_launcher_presets_compose(launcher, target):
    r = cli("run", "+experiment=sva_tiny", f"hydra/launcher={launcher}", "--cfg", "hydra")
    assert r.returncode == 0, r.stderr
    assert target in r.stdout


def _status(d: Path) -> dict:
    import json

    try:
        return json.loads((d / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _own_cache(tmp_path: Path) -> dict[str, str]:
    """A cache of the job's own, the suite's tiny models linked in: the job extracts and fits its probes again (a
    warm suite's probe fits would end it within the second the signal tests wait) without training a model."""
    from tests.conftest import suite_cache

    cache = tmp_path / "cache"
    cache.mkdir()
    (suite_cache() / "models").mkdir(parents=True, exist_ok=True)
    (cache / "models").symlink_to(suite_cache() / "models", target_is_directory=True)
    return {"CPROBE_CACHE_DIR": str(cache)}


@pytest.mark.slow
def test_ctrl_c_exits_130_and_marks_the_job_interrupted(tmp_path):
    import signal

    run_dir = tmp_path / "run"
    # 10 MLP epochs: ~30 s of probe training after the job is marked running, so the signal always lands mid-job
    p = start("run", "+experiment=sva_tiny", "--smoke", "probe=mlp", "probe.mlp.epochs=10", f"hydra.run.dir={run_dir}",
              cwd=tmp_path, env=_own_cache(tmp_path),
              # Ctrl-C in a terminal: the default disposition, even when this test runs in a background
              # job whose shell set SIGINT to ignored (which the child would inherit)
              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while _status(run_dir).get("state") != "running" and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)
    finished_early = p.poll() is not None
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert not finished_early, f"the job ended before the signal: state {_status(run_dir)}; {out[-1000:]}"
    assert p.returncode == 130, f"{err[-1500:]}\n{out[-1000:]}"
    assert _status(run_dir)["state"] == "interrupted"
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_sigkill_leaves_a_dead_job_that_collect_names_and_sigterm_is_handled_like_ctrl_c(tmp_path):
    """A killed job used to stay `running` forever; SIGTERM now marks it `interrupted` and exits 143."""
    import signal

    run_dir = tmp_path / "run"
    argv = ["run", "+experiment=sva_tiny", "--smoke", "probe=mlp", "probe.mlp.epochs=10", f"hydra.run.dir={run_dir}"]

    env = _own_cache(tmp_path)

    def start_and_wait_running() -> subprocess.Popen:
        p = start(*argv, cwd=tmp_path, env=env)
        deadline = time.time() + 240
        while (_status(run_dir).get("state"), _status(run_dir).get("pid")) != ("running", p.pid) \
                and time.time() < deadline and p.poll() is None:
            time.sleep(0.2)
        time.sleep(1.0)
        assert p.poll() is None, f"the job ended before the signal: {_status(run_dir)}"
        return p

    p = start_and_wait_running()
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert _status(run_dir)["state"] == "running"  # nobody could write otherwise
    r = cli("collect", str(run_dir))
    assert r.returncode == 1 and f"is dead (its process {p.pid} on" in r.stderr, r.stderr

    p = start_and_wait_running()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 143, f"{err[-1500:]}\n{out[-1000:]}"
    status = _status(run_dir)
    assert status["state"] == "interrupted" and status["signal"] == "SIGTERM"
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert "died while running" in err + out  # the rerun said what it found


@pytest.mark.slow
def test_resume_skips_only_a_done_job_with_the_same_config(tmp_path):
    base = ["run", "+experiment=sva_tiny", "--smoke", "probe=linear", "layers=last", f"hydra.run.dir={tmp_path}"]
    assert cli(*base).returncode == 0
    first = _status(tmp_path)
    again = cli(*base)
    assert again.returncode == 0 and "skipping" in again.stderr + again.stdout
    changed = cli(*base, "seed=1")
    assert changed.returncode == 0 and "different config; running again" in changed.stderr + changed.stdout
    assert _status(tmp_path)["config_hash"] != first["config_hash"] and _status(tmp_path)["state"] == "done"


def test_explicit_probe_overrides_win_over_presets_and_cfg_job_shows_them():
    r = cli("run", "+experiment=sva_tiny", "--smoke", "probe.mlp.lrs=[0.1]", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    import yaml

    cfg = yaml.safe_load(r.stdout)
    assert cfg["probe"]["mlp"]["lrs"] == [0.1] and cfg["probe"]["mlp"]["widths"] == [64]  # smoke preset elsewhere
    r = cli("run", "+experiment=sva_tiny", "probe=linear", "--smoke", "--cfg", "job")
    assert list(yaml.safe_load(r.stdout)["probe"]) == ["linear"]  # the command line's probe choice wins


def test_tiny_model_below_its_gate_is_an_error(tmp_path):
    r = cli("run", "+experiment=sva_tiny", "--smoke", "model.tiny.gate=1.01", f"paths.output_root={tmp_path}")
    assert r.returncode == 1 and "below its gate 1.01 (model.tiny.gate)" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1
