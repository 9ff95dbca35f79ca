"""``cprobe.run``: a job or a sweep from Python (a notebook), as ``cprobe run`` runs it. It returns the run's (or
the sweep's) directory, refuses bad input with the CLI's one line before any directory exists, and gives the process
back as it found it: working directory, root logging handlers (the job's log file closed), torch threads and cprobe's
thread policy, matplotlib backend, Hydra's global state. The notebook (tests/smoke/test_notebook.py) runs single
jobs through it."""

from __future__ import annotations

import json
import logging
import os

import pytest

import cprobe
from cprobe.errors import ConfigError


def _state():
    import torch
    from hydra.core.global_hydra import GlobalHydra

    from cprobe.compute import thread_policy

    return (os.getcwd(), logging.getLogger().handlers[:], torch.get_num_threads(),
            GlobalHydra.instance().is_initialized(), thread_policy())


@pytest.mark.parametrize("overrides,needle", [
    (("+experiment=sva_tiny", "--cfg", "job"), "takes overrides and -m, not ['--cfg']"),
    (("layers=last",), "cprobe.run needs an experiment"),
    (("+experiment=sva_tiny", "intervention=nope"), "unknown intervention 'nope'; choose from ["),
    (("+experiment=sva_tiny", "+layer=2"), "unknown"),
    (("+experiment=sva_tiny", "layers=99"), "layer"),  # refused by the job's validation, after Hydra set up logging
])
def test_bad_input_is_one_config_error_and_leaves_nothing(overrides, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = _state()
    with pytest.raises(ConfigError) as e:
        cprobe.run(*overrides, smoke=True)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.json"))
    assert _state() == before


@pytest.mark.slow
def test_a_sweep_returns_its_aggregated_directory_and_the_process_is_given_back(tmp_path, monkeypatch):
    import matplotlib

    monkeypatch.chdir(tmp_path)
    matplotlib.use("svg")  # a backend that is not the jobs' Agg, as a notebook's inline one
    import matplotlib.pyplot  # noqa: F401  (pyplot imported: the backend is the user's)

    try:
        before = _state()
        out = cprobe.run("-m", "+experiment=sva_tiny", "layers=last", "seed=0,1", smoke=True)
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use("Agg")
    assert _state() == before
    assert out.is_absolute() and out.parent == tmp_path / "outputs" / "sweeps" / "sva_tiny"
    jobs = sorted(p.parent for p in out.rglob("status.json"))
    assert [p.name for p in jobs] == ["layers=last,seed=0", "layers=last,seed=1"]
    assert all(json.loads((j / "status.json").read_text())["state"] == "done" for j in jobs)
    assert (out / "results.csv").is_file() and (out / "records.parquet").is_file()
    logs = [j / "cprobe.log" for j in jobs]
    sizes = [p.stat().st_size for p in logs]
    logging.getLogger().warning("after the sweep: must not reach a job's log file")
    assert [p.stat().st_size for p in logs] == sizes
    # a second single run in the same process: its own directory (a new time stamp or _2), returned
    one = cprobe.run("+experiment=sva_tiny", "layers=last", smoke=True)
    assert one.parent == tmp_path / "outputs" / "runs" / "sva_tiny" and (one / "records.parquet").is_file()
    assert _state() == before
