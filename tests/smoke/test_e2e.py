"""End-to-end runs of the CLI as a user runs them (slow: they train/extract real tiny models).

In process (``tests.cli.run``: the Typer app the console script calls, the same code path, without a new
interpreter's start-up); the parallel launchers still start their own worker processes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.cli import REPO
from tests.cli import run as cprobe

pytestmark = pytest.mark.slow


def _run_dir(out: Path) -> Path:
    (d,) = [p.parent for p in out.rglob("status.json")]
    return d


def test_demo_sva_tiny_meets_acceptance(tmp_path):
    """The README demo: last-layer z_c probe ≥ 0.95 and task accuracy ≥ 0.95, table + plot written."""
    r = cprobe("run", "+experiment=sva_tiny", f"paths.output_root={tmp_path}", "progress=false", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    d = _run_dir(tmp_path)
    t = pd.read_parquet(d / "metrics.parquet")
    assert set(t["probe"]) == {"linear", "mlp"} and set(t["property"]) == {"z_c", "z_e"}
    assert t["layer"].nunique() == 5
    last = t[(t["layer"] == t["layer"].max()) & (t["property"] == "z_c")]
    assert (last["accuracy"] >= 0.95).all(), last
    assert t["task_accuracy"].iloc[0] >= 0.95
    assert (d / "metrics.csv").is_file() and (d / "metrics.md").is_file() and (d / "accuracy_by_layer.png").is_file()
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    # a rerun of the same job dir is skipped
    r2 = cprobe("run", "+experiment=sva_tiny", f"paths.output_root={tmp_path}", f"hydra.run.dir={d}",
                "progress=false", cwd=REPO)
    assert r2.returncode == 0 and "skipping" in r2.stderr + r2.stdout


def test_same_seed_gives_byte_identical_metric_tables(tmp_path):
    for out in ("a", "b"):
        r = cprobe("run", "+experiment=sva_tiny", "--smoke", "layers=[2,4]", f"paths.output_root={tmp_path / out}",
                   cwd=REPO)
        assert r.returncode == 0, r.stderr[-3000:]
        assert (r.stdout + r.stderr).count("duplicated sentence(s)") == 1, r.stdout  # a dataset note is logged once
    a, b = (_run_dir(tmp_path / o) for o in ("a", "b"))
    for f in ("metrics.csv", "metrics.md", "records.parquet", "leaderboard.csv", "leaderboard.md"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_the_job_runs_on_the_threads_it_is_told_and_environment_json_says_so(tmp_path):
    """compute.threads overrides the thread policy (docs/performance.md, "A shared CPU"); environment.json records
    the count, what decided it, the wait policy and the OpenMP runtime."""
    r = cprobe("run", "+experiment=sva_tiny", "--smoke", "layers=[4]", "compute.threads=1", "progress=false",
               f"paths.output_root={tmp_path}", cwd=REPO, env={"OMP_NUM_THREADS": None})
    assert r.returncode == 0, r.stderr[-3000:]
    env = json.loads((_run_dir(tmp_path) / "environment.json").read_text())
    policy = env["thread_policy"]
    assert policy["threads"] == 1 and policy["threads_from"] == "compute.threads" and policy["explicit"]
    assert policy["small_fits"] == 1 and policy["wait_policy"] in ("PASSIVE", "ACTIVE", "OpenMP default")
    assert env["openmp"] and policy["usable_cpus"] >= 1


def test_multirun_two_probes_one_table_and_shared_activations(tmp_path):
    r = cprobe("run", "-m", "+experiment=sva_tiny", "probe=linear,mlp", "--smoke",
               f"hydra.sweep.dir={tmp_path}", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p.parent.name for p in tmp_path.rglob("metrics.parquet") if p.parent != tmp_path)
    assert jobs == ["probe=linear", "probe=mlp"]
    t = pd.read_csv(tmp_path / "results.csv")
    assert set(t["probe"]) == {"linear", "mlp"}
    logs = (tmp_path / "probe=mlp" / "cprobe.log").read_text()
    assert "cache hit" in logs  # the second job reuses the first job's activations
    # `cprobe collect` redoes the aggregation
    (tmp_path / "results.csv").unlink()
    assert cprobe("collect", str(tmp_path), cwd=REPO).returncode == 0
    assert (tmp_path / "results.csv").is_file()


def test_failed_job_is_recorded_and_exit_code_nonzero(tmp_path):
    r = cprobe("run", "-m", "+experiment=sva_tiny", "layers=2,99", "--smoke", f"hydra.sweep.dir={tmp_path}", cwd=REPO)
    assert r.returncode == 1 and "1 job(s) failed" in r.stderr
    bad = json.loads((tmp_path / "layers=99" / "status.json").read_text())
    assert bad["state"] == "failed" and "out of range" in bad["error"]
    assert (tmp_path / "layers=2" / "metrics.csv").is_file()


def test_missing_hub_model_fails_fast_with_instructions(tmp_path):
    r = cprobe("run", "+experiment=bert_sva", "model.path=not-a-real/model-xyz", f"paths.output_root={tmp_path}",
               cwd=REPO)
    assert r.returncode == 1
    assert "huggingface-cli download" in r.stderr and r.stderr.count("\n") == 1


def test_submitit_local_runs_and_aggregates(tmp_path):
    """submitit (the SLURM launcher's local twin) runs the task function out of process; the parent still aggregates.
    (joblib's local processes, ``hydra/launcher=local_parallel``: the README's line, tests/smoke/test_readme.py.)"""
    r = cprobe("run", "-m", "+experiment=sva_tiny", "probe=linear", "layers=3,4", "hydra/launcher=submitit_local",
               "--smoke", f"hydra.sweep.dir={tmp_path}", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    t = pd.read_csv(tmp_path / "results.csv")
    assert sorted(t["layer"].unique()) == [3, 4]
