"""Every study's README run (``study_runs``: the README's own study lines, run once per session): its records
(registered metrics, deterministic, the paper tables rebuilt from them), and
`cprobe collect` over all of them at once (one leaderboard, each study's tables apart)."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from cprobe import records as R
from cprobe.outputs import collect, make_records, spec_of
from cprobe.tasks import task_module
from tests import cli
from tests.study_runs import STUDIES

pytestmark = pytest.mark.slow


def jobs(d: Path) -> list[Path]:
    return sorted(p.parent for p in d.rglob("status.json"))


def test_every_study_writes_registered_deterministic_records(study_runs):
    assert set(study_runs) == set(STUDIES)
    for study, d in study_runs.items():
        for job in jobs(d):
            recs = R.read_records(job / R.RECORDS_FILE)
            assert R.problems(recs) == [], (study, R.problems(recs))
            assert set(recs["study"]) == {study} and recs["config_id"].nunique() == 1 and len(recs) > 0
            assert not any(c.endswith("_s") for c in recs.columns)
            # one measurement, one record: two records that differ only in value/n/info would be read as two seeds
            # of one cell by the leaderboard (a control zoo's models share the main zoo's names, for instance)
            key = [c for c in R.COLUMNS if c not in ("value", "n", "info")]
            dup = recs[recs.duplicated(key, keep=False)]
            assert dup.empty, (study, dup.head(4).to_dict("records"))
            assert not any(k.endswith("_s") or k == "seconds" for s in recs["info"] for k in R.parse_cell(s))
            # the records rebuilt from the job's metric table (timings apart) and the per-item values of its documented
            # items file are byte-identical to the records the job made from the values its task returned in memory
            table = pd.read_parquet(job / "metrics.parquet")
            side = spec_of(study).items_file
            values = pd.read_parquet(job / side) if side and (job / side).is_file() else None
            assert (values is None) == (side is None), (study, side)
            again, items = make_records(study, table, values, recs["config_id"].iloc[0], int(table["seed"].iloc[0]))
            # provenance is kept out of the metric tables (outputs.finish_job): the rebuilt records take the job's
            again["source"] = recs["source"].to_numpy()
            buf = io.BytesIO()
            again.to_parquet(buf, index=False)
            assert buf.getvalue() == (job / R.RECORDS_FILE).read_bytes(), study
            if (job / R.ITEMS_FILE).is_file():
                pd.testing.assert_frame_equal(pd.read_parquet(job / R.ITEMS_FILE), R.finish_items(items))


def _outputs(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir()) if f.suffix in (".csv", ".md", ".png")}


def test_the_paper_tables_are_views_of_the_records(study_runs, tmp_path):
    """Each study's report built from its metric table writes the files the job wrote, byte for byte: the job built
    its report from its records (``outputs.finish_job``), so the tables are views of the records. (The records read
    back from the job's file are its records: ``test_every_study_writes_registered_deterministic_records``.)"""
    for study, d in study_runs.items():
        module = task_module(study)
        for i, job in enumerate(jobs(d)):
            a = tmp_path / f"{study}{i}"
            a.mkdir(parents=True)
            module.report(pd.read_parquet(job / "metrics.parquet"), a)
            assert _outputs(a), study
            written = _outputs(job)
            assert {k: v for k, v in written.items() if k in _outputs(a)} == _outputs(a), study


def test_the_real_data_runs_recompute_from_their_per_pair_files(study_runs):
    """The README's CEBaB and LIBERTy runs (real CEBaB, the CV Screening SCM; every default explainer): each
    explainer's errors, the model's CaCE / sensitivity, recomputed from the job's per-pair file (the same checks as
    the studies' tiny end-to-end sweeps, tests/integration/test_{cebab,liberty}_task.py)."""
    from tests import cebab_fixtures, liberty_fixtures

    for study, check in (("cebab", cebab_fixtures.check_pair_effects), ("liberty", liberty_fixtures.check_pair_effects)):
        job = study_runs[study]
        names = [c.removeprefix("estimate_") for c in pd.read_parquet(job / f"{study}_pair_effects.parquet").columns
                 if c.startswith("estimate_")]
        assert len(names) >= 8, (study, names)
        check(job, tuple(names))


def test_a_causalgym_run_writes_its_summary_and_table1(study_runs, tmp_path):
    """The README's CausalGym line (one job, the default methods) writes the study's tables and its report; `cprobe
    collect` over it adds the results table. (Aggregating jobs with different methods into one table:
    tests/integration/test_causalgym_task.py::test_collect_aggregates_a_causalgym_sweep.)"""
    d = study_runs["causalgym"]
    for name in ("causalgym_overall", "causalgym_summary", "causalgym_table1", "leaderboard"):
        assert (d / f"{name}.csv").is_file(), name
    t1 = pd.read_csv(d / "causalgym_table1.csv")
    assert set(t1["method"]) == {"das", "probe", "mean", "random", "(tasks averaged)"}
    assert (d / "report.html").is_file()
    import shutil

    shutil.copytree(d, tmp_path / "causalgym" / "job")
    r = cli.run("collect", str(tmp_path / "causalgym"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("causalgym_overall", "causalgym_summary", "causalgym_table1", "results", "leaderboard"):
        assert (tmp_path / "causalgym" / f"{name}.csv").is_file(), name
    assert set(pd.read_csv(tmp_path / "causalgym" / "causalgym_table1.csv")["method"]) == set(t1["method"])


def test_collect_over_every_study_writes_one_leaderboard(study_runs, monkeypatch):
    root = next(iter(study_runs.values())).parent
    r = cli.run("collect", str(root), cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "wrote" in r.stdout and "report.html (9 job(s)" in r.stdout
    board = pd.read_csv(root / "leaderboard.csv")
    assert set(board["study"]) == set(STUDIES)
    recs = pd.read_parquet(root / "records.parquet")
    assert set(recs["study"]) == set(STUDIES) and R.problems(R.finish(recs)) == []
    methods = {s: set(board.loc[board["study"] == s, "method"].fillna("")) for s in STUDIES}
    assert methods["probing"] == {"linear", "mlp"} and methods["reliability"] == {"pgd"}
    assert methods["causalgym"] == {"das", "probe", "mean", "random"}
    assert methods["cebab"] == {"random", "approx", "conexp", "s_learner", "tcav", "conceptshap", "inlp", "leace"}
    assert methods["liberty"] >= {"random", "approx", "ft_match"}
    assert {"", "original", "random"} <= methods["prompt_bias"]
    assert methods["axbench"] == {"mean", "probe", "pca", "lda", "kmeans", "random"}
    assert methods["ravel"] == {"das", "mdas", "mean", "pca", "random", "vanilla"}
    assert methods["mib"] == {"das", "dbm", "mean", "vanilla"}
    # per model and layer: the probes' rows carry their read layer
    probing = board[board["study"] == "probing"]
    assert sorted(probing["read_layer"].unique()) == [0, 1, 2, 3, 4] and set(probing["metric"]) == {"probe_accuracy"}
    # one seed: a cell's mean is its record's value; the interval is over items where a study writes them
    rel = board[(board["study"] == "reliability") & (board["metric"] == "reliability")].iloc[0]
    rec = recs[(recs["study"] == "reliability") & (recs["metric"] == "reliability") & (recs["slice"] == "{}")]
    assert rel["mean"] == pytest.approx(rec["value"].iloc[0]) and pd.isna(rel["ci_low"])
    assert rel["ci"].startswith("none")
    ceb = board[(board["study"] == "cebab") & (board["metric"] == "icace_error_l2")]
    assert ceb["ci"].str.startswith("bootstrap over items").all() and (ceb["items"] > 1).all()
    assert (ceb["ci_low"] <= ceb["mean"]).all() and (ceb["mean"] <= ceb["ci_high"]).all()
    pb = board[(board["study"] == "prompt_bias") & (board["metric"] == "lama_p1")]
    assert len(pb) and pb["ci"].str.startswith("bootstrap over items").all()  # the relations
    # each study's table and paper tables apart, with only its own columns
    for study in STUDIES:
        res = pd.read_csv(root / study / "results.csv")
        assert set(res["task"]) == {study}
    assert "cebab_task" not in pd.read_csv(root / "probing" / "results.csv").columns
    assert (root / "reliability" / "table1.csv").is_file() and (root / "causalgym" / "causalgym_table1.csv").is_file()
    assert (root / "cebab" / "cebab_icace_error.csv").is_file() and (root / "report.html").is_file()
    md = (root / "leaderboard.md").read_text()
    assert all(f"## {s}" in md for s in STUDIES)
    # collecting again, over the collected files now beside the jobs, gives the same leaderboard (the studies' reports
    # left out this time: the leaderboard does not read them, and drawing them again took 20 s)
    first = (root / "leaderboard.csv").read_bytes()
    for study in STUDIES:
        monkeypatch.setattr(task_module(study), "report", lambda table, out_dir: None)
    collect(root)
    assert (root / "leaderboard.csv").read_bytes() == first


def test_collect_puts_the_yardsticks_side_by_side(study_runs):
    """`cprobe collect` over every study writes yardsticks.{csv,md}: each cell is the leaderboard's cell of its study,
    method and model (the same text), the studies without a method on a yardstick (probe accuracies, evaluation
    settings) are left out, and the report has the section."""
    from cprobe.leaderboard import cell_text
    from cprobe.yardsticks import method_of

    root = next(iter(study_runs.values())).parent
    if not (root / "yardsticks.csv").is_file():  # collected by the leaderboard test before it in this group
        collect(root)
    yard = pd.read_csv(root / "yardsticks.csv", dtype=str, keep_default_na=False)
    assert "# Yardsticks side by side" in (root / "yardsticks.md").read_text()
    studies = {c.split(":")[0] for c in yard.columns[3:]}
    assert {"reliability", "causalgym", "cebab", "liberty"} <= studies and not studies & {"probing", "prompt_bias"}
    board = pd.read_csv(root / "leaderboard.csv", keep_default_na=False)
    odds = board[(board["study"] == "causalgym") & (board["metric"] == "overall_odds")]
    assert len(odds) == 4
    for rec in odds.itertuples():  # CausalGym's overall odds: over layers, so the row has no layer
        row = yard[(yard["model"] == rec.model) & (yard["method"] == method_of(rec.method, rec.family))]
        assert row["layer"].tolist() == [""]
        assert row["causalgym: overall odds-ratio ↑"].item() == cell_text(
            rec.mean, *(float(x) if x != "" else float("nan") for x in (rec.ci_low, rec.ci_high)))
    pgd = yard[yard["method"] == "pgd"]
    assert pgd["layer"].tolist() == ["4"] and pgd["reliability: which"].item().startswith("counterfactual at target")
    assert "Yardsticks side by side" in (root / "report.html").read_text()
