"""Trackers and searches for real, offline, from one `cprobe run`: an Optuna search of 4 trials (a 4-job sweep)
logged to MLflow (local SQLite store), TensorBoard and W&B (offline) at once, read back with each one's own reader,
its winner checked against `cprobe collect` of the same directory and its study rebuilt from the directory (resume);
two of its jobs through a real `mlflow server` on 127.0.0.1 (when it comes up within the budget; it starts in the
background first) and a server gone; and the refusals before anything is written (a missing logger package, a search
that cannot run).

Cost: one `cprobe run` (4 smoke jobs), in process (``tests.cli.run``) like the refusals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cprobe.trackers.base import JobLog, flatten, points
from tests.cli import run as cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _wandb_env(root: Path) -> dict[str, str]:
    """W&B offline, its caches and settings in the test's directory (never the home dir, never a key)."""
    env = {k: str(root / f"wandb_{k.split('_')[1].lower()}") for k in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR",
                                                                       "WANDB_DATA_DIR")}
    return {**env, "WANDB_MODE": "offline", "WANDB_API_KEY": "", "WANDB_SILENT": "true"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1, started in the background first (it takes 10-60 s to come up); yields
    (uri, process) — the test waits for it only as long as its budget allows. Without MLflow 3's job execution:
    its Huey consumer processes (GenAI jobs, unused here) import MLflow again and again, ~2 CPU-minutes of the
    suite's time on 2 cores."""
    d = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    p = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port",
                          str(port), "--backend-store-uri", f"sqlite:///{d}/server.db", "--artifacts-destination",
                          str(d / "artifacts"), "--workers", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=d,
                         env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    yield f"http://127.0.0.1:{port}", p
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


SEARCH = ["run", "-m", "+experiment=sva_tiny_reliability", "--smoke", "intervention=inlp", "hparams_search=reliability",
          "hydra.sweeper.n_trials=4", "intervention.rank=range(0,4)"]


@pytest.fixture(scope="module")
def logged(tmp_path_factory, mlflow_server):
    """The search, every logger on: (output root, sweep dir, {job name: dir}, the run)."""
    out = tmp_path_factory.mktemp("logged")
    r = cli(*SEARCH, "logger=[csv,mlflow,tensorboard,wandb]", f"paths.output_root={out}", cwd=out,
            env=_wandb_env(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "failed while" not in r.stdout + r.stderr, r.stdout[-3000:]  # no tracker failed
    sweep = (out / "sweeps" / "sva_tiny_reliability" / "latest").resolve()
    jobs = {p.name: p for p in sweep.iterdir() if (p / "status.json").is_file()}
    assert sorted(jobs) == [f"intervention.rank={i},intervention=inlp" for i in range(4)]
    return out, sweep, jobs, r


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_holds_the_sweep_as_a_parent_with_a_child_per_job(logged, tmp_path):
    from mlflow import MlflowClient

    out, sweep, jobs, _ = logged
    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    exp = client.get_experiment_by_name("sva_tiny_reliability")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("cprobe.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("cprobe.kind") == "job"]
    assert len(parents) == 1 and len(children) == 4
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["cprobe.sweep_dir"] == str(sweep)
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.html", "results.csv", "records.parquet", "search.json", "search.md"} <= arts
    search = json.loads((sweep / "search.json").read_text())  # the parent says which trial won and why
    assert parent.data.tags["best.trial"] == str(search["best"]["number"]) and parent.data.tags["best.why"] == \
        search["why"] and parent.data.metrics["best/reliability"] == pytest.approx(search["best"]["value"])
    done = [(t["number"], t["value"]) for t in search["trials"] if t["state"] == "COMPLETE"]
    assert _history(client, parent.info.run_id, "search/reliability") == [(n, pytest.approx(v)) for n, v in done]
    for run in children:
        job = jobs[run.info.run_name]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id and run.info.status == "FINISHED"
        params = run.data.params
        assert params["intervention.rank"] == run.info.run_name.split(",")[0].split("=")[1]
        assert params["task"] == "reliability"
        assert params["intervention.name"] == "inlp" and params["name"] == "sva_tiny_reliability"
        records = pd.read_parquet(job / "records.parquet")
        pts = points(records)
        assert len(pts) == records["value"].notna().sum() >= 10  # every record with a value is a metric
        for p in pts:
            assert _history(client, run.info.run_id, p.key) == [(p.step, pytest.approx(p.value))]
        assert run.data.metrics["reliability"] == pytest.approx(
            records.loc[(records.metric == "reliability"), "value"].item())
        assert run.data.tags["cprobe.method"] == "inlp" and run.data.tags["cprobe.state"] == "done"
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"report.html", "records.parquet", "metrics.csv", "table1.csv"} <= arts and "status.json" not in arts
        got = Path(client.download_artifacts(run.info.run_id, "records.parquet", str(tmp_path)))
        assert got.read_bytes() == (job / "records.parquet").read_bytes()


def test_loggers_leave_the_job_as_it_was(logged):
    """The job's records carry the config id of the same job without loggers; a logged job gains trackers.json."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import cprobe.pipeline  # noqa: F401
    from cprobe.records import config_id

    out, sweep, jobs, _ = logged
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=sva_tiny_reliability", "+debug=smoke", "intervention=inlp",
                                           "intervention.rank=3"])
    plain = OmegaConf.to_container(cfg, resolve=True)
    job = jobs["intervention.rank=3,intervention=inlp"]
    assert pd.read_parquet(job / "records.parquet")["config_id"].unique().tolist() == [config_id(plain)]
    logged_in = json.loads((job / "trackers.json").read_text())
    assert sorted(logged_in) == ["mlflow", "tensorboard", "wandb"]
    from cprobe.results import find_jobs

    assert find_jobs(out) == (sorted(jobs.values()), [])  # `cprobe collect outputs`: the trackers' stores are no jobs


def test_tensorboard_event_files_read_back(logged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, sweep, jobs, _ = logged
    root = out / "tensorboard" / "sweeps" / "sva_tiny_reliability" / sweep.name
    for name, job in jobs.items():
        ea = EventAccumulator(str(root / name), size_guidance={"scalars": 0, "tensors": 0})
        ea.Reload()
        pts = points(pd.read_parquet(job / "records.parquet"))
        for p in pts:
            assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in ea.Scalars(p.key)] == [(p.step, p.value)]
        assert {"status/text_summary", "config/text_summary"} <= set(ea.Tags()["tensors"])
        assert "hparams/reliability" in ea.Tags()["scalars"]  # the HParams tab's metric
    ea = EventAccumulator(str(root), size_guidance={"tensors": 0, "images": 0})
    ea.Reload()
    assert "sweep_result/text_summary" in ea.Tags()["tensors"] and "search/reliability" in ea.Tags()["scalars"]
    assert any(t.startswith("figures/fig1_tradeoffs") for t in ea.Tags()["images"])


def test_wandb_offline_runs_read_back(logged):
    """`wandb leet inspect --json` (W&B's own reader of the .wandb transaction log): one run per job in the sweep's
    group, the sweep's own run, every record in the history, the job's state and its files as an artifact."""
    out, sweep, jobs, _ = logged
    wandb = str(Path(sys.executable).with_name("wandb"))
    # in the order the runs last wrote their logs: the sweep's run ends after every job's (the folders' names hold
    # the start to the second only, and a fast machine starts the sweep's run in the same second as the last job's)
    dirs = sorted((out / "wandb").glob("offline-run-*"),
                  key=lambda d: max(f.stat().st_mtime_ns for f in d.glob("*.wandb")))
    assert len(dirs) == len(jobs) + 1
    runs = {}
    for d in [*dirs[:2], dirs[-1]]:  # two jobs' runs and the sweep's (written last): each read costs seconds
        lines = subprocess.run([wandb, "leet", "inspect", "--json", str(d)], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        records = [json.loads(l) for l in lines]
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        (exit_,) = [r["exit"] for r in records if r["type"] == "exit"]
        summary, history = {}, {}
        for r in records:
            if r["type"] == "summary":
                summary.update(r["summary"].get("update", {}))
            if r["type"] == "history":
                item = r["history"]["item"]
                history.update({(k, item["_step"]): v for k, v in item.items()
                                if not k.startswith(("_", "records.")) and isinstance(v, (int, float))})
        runs[run["display_name"]] = (run, exit_, summary, history, records)
    group = f"sva_tiny_reliability/{sweep.name}"
    assert f"{group} (sweep)" in runs and len(runs) == 3 and set(runs) - {f"{group} (sweep)"} <= set(jobs)
    for name, (run, exit_, summary, history, records) in runs.items():
        if name not in jobs:
            continue
        job = jobs[name]
        assert run["run_group"] == group and run["job_type"] == "job" and run["project"] == "cprobe"
        assert run["config"]["update"]["intervention"]["rank"] == int(name.split(",")[0].split("=")[1])
        assert exit_["exit_code"] == 0
        recs = pd.read_parquet(job / "records.parquet")
        assert history == {(p.key, p.step): pytest.approx(p.value) for p in points(recs)}
        nrows = summary["records"]["nrows"] if "records" in summary else summary["records.nrows"]
        assert summary["state"] == "done" and nrows == len(recs)  # the records table, every field a column
        assert any(r["type"] == "artifact" and r["artifact"]["type"] == "cprobe-job" for r in records)
    run, exit_, summary, _, _ = runs[f"{group} (sweep)"]
    assert run["job_type"] == "sweep" and summary["state"] == "done" and exit_["exit_code"] == 0
    assert summary["best_value"] == pytest.approx(json.loads((sweep / "search.json").read_text())["best"]["value"])


def _job_log(job: Path, sweep: Path) -> JobLog:
    cfg = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
    return JobLog(out_dir=job, run_name=job.name, experiment="sva_tiny_reliability", params=flatten(cfg),
                  records=pd.read_parquet(job / "records.parquet"),
                  status=json.loads((job / "status.json").read_text()), sweep_dir=sweep)


def test_mlflow_server_then_gone(logged, mlflow_server, caplog):
    """Through a real `mlflow server` (if it came up within the budget), the same jobs read back with MLflow's
    client; then the server is gone: one warning, nothing raised, the local files untouched."""
    from cprobe.trackers import lifecycle
    from cprobe.trackers.mlflow import MLflowTracker, Options

    out, sweep, jobs, _ = logged
    uri, proc = mlflow_server
    deadline = time.time() + 45
    up = False
    while time.time() < deadline and proc.poll() is None and not up:
        try:
            with socket.create_connection(("127.0.0.1", int(uri.rsplit(":", 1)[1])), timeout=1):
                up = True
        except OSError:
            time.sleep(1)
    if up:
        time.sleep(1)
        t = MLflowTracker(Options(tracking_uri=uri, experiment="served", http_retries=3, http_timeout=30))
        parent = t.start_sweep(sweep, "served/sweep", "served", [])
        for job in list(jobs.values())[:2]:
            t.log_job(_job_log(job, sweep), parent)
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([parent["experiment_id"]])
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent["run_id"]]
        assert len(kids) == 2 and all(r.data.metrics["reliability"] > 0 for r in kids)
        assert "records.parquet" in {a.path for a in client.list_artifacts(kids[0].info.run_id)}
        os.killpg(proc.pid, signal.SIGKILL)  # gone, as a crashed or unplugged server is
        proc.wait(timeout=30)
    else:
        uri = f"http://127.0.0.1:{_free_port()}"  # never up: as gone as a server can be
    first = next(iter(jobs.values()))
    before = {p: p.stat().st_mtime_ns for p in first.rglob("*")}
    lifecycle._OFF.clear()  # which trackers failed in this process, forgotten
    gone = MLflowTracker(Options(tracking_uri=uri, experiment="served", http_retries=0, http_timeout=5))
    with caplog.at_level("WARNING", logger="cprobe"):
        for job in list(jobs.values())[:2]:
            assert lifecycle._guard(gone, "logging the job", gone.log_job, _job_log(job, sweep), None) is None
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "logger mlflow failed" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert {p: p.stat().st_mtime_ns for p in first.rglob("*")} == before
    lifecycle._OFF.clear()  # which trackers failed in this process, forgotten
    if not up:
        pytest.skip("mlflow server did not start within 45 s; the gone-server half ran")


# ----------------------------------------------------------------------------------------------- search
def test_search_best_trial_is_the_best_job_of_cprobe_collect(logged):
    from typer.testing import CliRunner

    from cprobe.cli import app

    out, sweep, jobs, r = logged
    s = json.loads((sweep / "search.json").read_text())
    assert s["metric"] == "reliability" and s["direction"] == "maximize" and "registry" in s["direction_from"]
    run_trials = [t for t in s["trials"] if t["duplicate_of"] is None]
    assert len(run_trials) == 4 and all(t["state"] == "COMPLETE" for t in run_trials)
    assert sorted(t["params"]["intervention.rank"] for t in run_trials) == [0, 1, 2, 3]  # the whole space, once
    res = CliRunner().invoke(app, ["collect", str(sweep)])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(sweep / "results.csv")
    assert sorted(table["job"]) == sorted(t["job"] for t in run_trials)
    best_row = table.loc[table["reliability"].idxmax()]
    assert s["best"]["job"] == best_row["job"] and s["best"]["value"] == pytest.approx(best_row["reliability"])
    assert f"trial {s['best']['number']} (intervention.rank={s['best']['params']['intervention.rank']}) has the " \
           f"highest reliability" in (sweep / "search.md").read_text()
    assert "search: trial" in r.stdout and "has the highest reliability" in r.stdout
    page = (sweep / "report.html").read_text()
    assert '<section id="search">' in page and f"trial {s['best']['number']} (intervention.rank=" in page


def test_search_resumes_from_its_directory(logged):
    """A rerun into the same sweep dir rebuilds the study from the finished trials (nothing to launch)."""
    import optuna

    from cprobe import search
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out, sweep, jobs, _ = logged
    space = {"intervention.rank": optuna.distributions.IntDistribution(0, 3)}
    s = search.Search(search.SearchOptions(), "maximize", "test", [], space, "reliability", sweep)
    study = optuna.create_study(direction="maximize")
    assert search._resume(s, study, OverridesParser.create()) == 4
    got = {t.params["intervention.rank"]: t.value for t in study.trials}
    want = {t["params"]["intervention.rank"]: t["value"] for t in json.loads((sweep / "search.json").read_text())
            ["trials"] if t["duplicate_of"] is None}
    assert got == pytest.approx(want) and search._distinct(study) == 4


def test_a_refused_search_leaves_no_directory(tmp_path):
    """Validation fails before any job: the sweep dir Hydra's callback claimed (still empty) is removed."""
    from tests.unit.test_search import _sweeper

    from cprobe import search
    from cprobe.errors import JobAborted

    from cprobe import ownership

    sw = _sweeper(tmp_path, "+experiment=sva_tiny_reliability", "hparams_search=reliability", "intervention=leace")
    made = ownership.record(tmp_path / "sweep")  # what the callback notes before the launcher creates the directory
    ownership.MADE[made.directory] = made
    (tmp_path / "sweep").mkdir()
    with pytest.raises(JobAborted, match="intervention 'leace' has no hyperparameter"):
        search.run(sw, ["+experiment=sva_tiny_reliability", "hparams_search=reliability", "intervention=leace"])
    assert not (tmp_path / "sweep").exists()


def test_a_refused_search_keeps_a_directory_that_was_there(tmp_path):
    """The same refusal in a directory the user made beforehand: it stays, with what it held."""
    from tests.unit.test_search import _sweeper

    from cprobe import ownership, search
    from cprobe.errors import JobAborted

    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "notes.txt").write_text("mine")
    made = ownership.record(tmp_path / "sweep")
    ownership.MADE[made.directory] = made
    sw = _sweeper(tmp_path, "+experiment=sva_tiny_reliability", "hparams_search=reliability", "intervention=leace")
    with pytest.raises(JobAborted, match="intervention 'leace' has no hyperparameter"):
        search.run(sw, ["+experiment=sva_tiny_reliability", "hparams_search=reliability", "intervention=leace"])
    assert [p.name for p in (tmp_path / "sweep").iterdir()] == ["notes.txt"]


def test_a_logger_whose_package_is_missing_is_refused_before_the_sweep(tmp_path, monkeypatch):
    """The Hydra callback's preflight refuses it before the sweep directory is claimed (what `cprobe run -m ...
    logger=wandb` prints as one line, exit 1, when wandb is not installed)."""
    import cprobe.trackers.lifecycle as T
    from cprobe.callbacks import AggregateResults
    from cprobe.errors import JobAborted
    from tests.unit.test_search import _sweeper

    from hydra.core.utils import setup_globals

    setup_globals()  # Hydra's ${now:...} resolver
    real = T.find_spec
    monkeypatch.setattr(T, "find_spec", lambda name: None if name == "wandb" else real(name))
    cfg = _sweeper(tmp_path, "+experiment=sva_tiny_reliability", "logger=[csv,wandb]",
                   f"paths.output_root={tmp_path / 'out'}", "hydra.sweep.dir=${paths.output_root}/s/${now:%H-%M-%S}"
                   ).config
    with pytest.raises(JobAborted) as e:
        AggregateResults().on_multirun_start(config=cfg)
    assert str(e.value) == "logger 'wandb' needs the wandb package, which is not installed: pip install 'cprobe[wandb]'"
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(T, "find_spec", real)  # installed: the same call claims the sweep directory
    AggregateResults().on_multirun_start(config=cfg)
    assert [p.name for p in (tmp_path / "out" / "s").iterdir()] != []
