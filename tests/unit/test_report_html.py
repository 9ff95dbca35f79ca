"""report.html from a directory's files, `cprobe report`, `cprobe list metrics`, and a sweep whose report fails."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cprobe import callbacks
from cprobe import records as R
from cprobe.errors import CprobeError
from cprobe.job import write_status
from cprobe.leaderboard import leaderboard
from cprobe.metrics.registry import METRICS
from cprobe.outputs import write_leaderboard
from cprobe.report import build_report, render, write_environment
from cprobe.results import write_table

runner = CliRunner()


def fake_run(d, note: str = "ok") -> None:
    """A finished probing job's files, as the pipeline writes them."""
    from cprobe.plots import caption, new_figure, save

    d.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame({"model": ["m", "m"], "dataset": ["d", "d"], "layer": [1, 2], "position": ["target"] * 2,
                          "property": ["z_c"] * 2, "probe": ["linear"] * 2, "accuracy": [0.75, 0.9],
                          "majority": [0.5, 0.5], "n_test": [40, 40], "task_accuracy": [1.0, 1.0],
                          "note": [note, note], "task": ["probing"] * 2, "seed": [0, 0]})
    write_table(table, d / "metrics")
    from cprobe.tasks.probing import RECORDS

    recs = R.to_records(table, RECORDS, "probing", 0, "cfg")
    R.write_records(recs, d)
    write_leaderboard(leaderboard(recs), d)
    write_table(pd.DataFrame({"a": [1, 2], "b": ["<script>alert(1)</script>", "x"]}), d / "table1")
    write_table(pd.DataFrame({"a": []}), d / "empty_table")
    fig, (ax,) = new_figure(1)
    ax.plot([0, 1], [0, 1])
    caption(fig, "Probe test accuracy by layer", property="z_c", model="m", data="d", n="40 test items", seed=0)
    save(fig, d / "accuracy_by_layer.png")
    (d / ".hydra").mkdir(exist_ok=True)
    (d / ".hydra" / "config.yaml").write_text("task: probing\nseed: 0\n")
    (d / ".hydra" / "overrides.yaml").write_text("- +experiment=sva_tiny\n")
    write_environment(d, {"device": "cpu"})
    write_status(d, state="done", task="probing", duration_s=1.5, timings={"extract_s": 0.5}, rows=2,
                 warnings=["dropped 1 item"])


def test_the_page_holds_everything_and_refers_to_nothing_outside(tmp_path):
    fake_run(tmp_path)
    page = render(tmp_path)
    for section in ("Overview", "Leaderboard", "Tables", "Figures", "Config", "Environment", "Timings", "Warnings"):
        assert f">{section}</h2>" in page
    assert page.count('src="data:image/png;base64,') == 1
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # cells are escaped
    assert "<tbody></tbody>" not in page and "empty_table: no rows" not in page
    assert "probe_accuracy ↑" in page and "0.750" in page  # the leaderboard's cells
    assert "task: probing" in page and "dropped 1 item" in page and "extract_s" in page
    assert json.loads((tmp_path / "environment.json").read_text())["device"] == "cpu"
    path = build_report(tmp_path)
    assert path == tmp_path / "report.html" and path.read_text(encoding="utf-8") == page


def test_a_collected_directory_lists_its_jobs_and_links_their_pages(tmp_path):
    fake_run(tmp_path / "a")
    fake_run(tmp_path / "b")
    build_report(tmp_path / "a")
    write_status(tmp_path / "c", state="failed", task="probing", error="boom")
    page = render(tmp_path)
    assert ">Jobs</h2>" in page and 'href="a/report.html"' in page and "boom" in page
    assert "3 job(s), 3.0 s in all" in page


def test_report_errors_are_one_line(tmp_path):
    with pytest.raises(CprobeError, match="is not a directory"):
        build_report(tmp_path / "nope")
    with pytest.raises(CprobeError, match="holds no cprobe run"):
        build_report(tmp_path)
    from cprobe.cli import app

    r = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 1 and "is not a directory" in r.output
    fake_run(tmp_path / "run")
    r = runner.invoke(app, ["report", str(tmp_path / "run")])
    assert r.exit_code == 0 and (tmp_path / "run" / "report.html").is_file()


def test_list_metrics_shows_every_metric_with_its_direction_and_reference():
    from cprobe.cli import app

    r = runner.invoke(app, ["list", "metrics"])
    assert r.exit_code == 0
    for name, m in METRICS.items():
        assert re.search(rf"^  {name} +", r.output, re.MULTILINE), name
        assert m.reference in r.output
    assert "lower is better" in r.output and "[leaderboard]" in r.output
    assert re.search(r"^  reliability .*\[leaderboard; ranks the study's settings in yardsticks\]$", r.output,
                     re.MULTILINE)


def test_a_failing_sweep_report_fails_the_sweep_in_one_line(tmp_path, monkeypatch):
    """Hydra swallows a callback's exception (a UserWarning, exit 0): the callback records it, the CLI exits 1."""
    import cprobe.outputs

    fake_run(tmp_path / "job")
    callbacks.reset()

    def boom(*a, **k):
        raise KeyError("fit_s")

    monkeypatch.setattr(cprobe.outputs, "collect", boom)
    cfg = SimpleNamespace(hydra=SimpleNamespace(sweep=SimpleNamespace(dir=str(tmp_path))))
    callbacks.AggregateResults().on_multirun_end(cfg)
    assert len(callbacks.REPORT_FAILED) == 1 and "KeyError: 'fit_s'" in callbacks.REPORT_FAILED[0]
    assert not callbacks.FAILED

    from cprobe import _hydra
    from cprobe.cli import app

    def sweep(argv, fn, config_dir):
        callbacks.AggregateResults().on_multirun_end(cfg)

    monkeypatch.setattr(_hydra, "run", sweep)
    r = runner.invoke(app, ["run", "-m", "+experiment=sva_tiny"])
    assert r.exit_code == 1
    err = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "the sweep's report failed: KeyError: 'fit_s'" in err[0]
    callbacks.reset()


def test_collect_over_jobs_without_records_converts_their_tables(tmp_path):
    """Runs written before records existed are read through their study's mapping."""
    from cprobe.outputs import collect

    fake_run(tmp_path / "old")
    (tmp_path / "old" / "records.parquet").unlink()
    out = collect(tmp_path)
    recs = pd.read_parquet(tmp_path / "records.parquet")
    assert set(recs["metric"]) == {"probe_accuracy", "majority_baseline", "task_accuracy"}
    board = pd.read_csv(out.leaderboard)
    assert board["mean"].tolist() == pytest.approx([0.75, 0.9]) and np.isnan(board["ci_low"]).all()
