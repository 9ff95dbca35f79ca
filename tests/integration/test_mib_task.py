"""The MIB study (cprobe.tasks.mib) through the CLI: the smoke experiment on the tiny MIB model — its cells, MIB's
aggregates and the controls, the records, the exported submission through the re-implemented verifier — and the
one-line refusals before any model loads."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cprobe import records as R
from cprobe.metrics.registry import unregistered
from tests import cli
from tests.study_runs import readme_runs_here


@pytest.fixture(scope="module")
def job(request, tmp_path_factory):
    """The smoke MIB job: the README's own line (`cprobe run +experiment=mib_tiny`, at smoke size: the same job) where
    this session runs the README's study lines anyway (``tests/study_runs.py``), else a run of its own."""
    if readme_runs_here(request.session):
        return request.getfixturevalue("study_runs")["mib"]
    out = tmp_path_factory.mktemp("mib")
    r = cli.run("run", "+experiment=mib_tiny", "--smoke", f"paths.output_root={out}", f"hydra.run.dir={out / 'job'}",
                cwd=out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "job"


@pytest.fixture(scope="module")
def table(job):
    return pd.read_parquet(job / "metrics.parquet")


@pytest.mark.slow
def test_every_cell_has_its_n_and_interval(table):
    acc = table[table["kind"] == "accuracy"].iloc[0]  # mib_tiny scores the smoke model on what it gets right
    assert acc["dataset"] == "mcqa" and acc["scored"] and 0 < acc["value"] <= 1 and acc["n_kept"] >= 1
    cells = table[table["kind"] == "cell"]
    assert set(cells["control"]) == {"none", "identity", "rotation", "untrained"}
    assert set(cells["method"]) == {"das", "dbm", "mean", "vanilla"}
    assert (cells["n"] > 0).all() and (cells["ci_low"] <= cells["value"] + 1e-12).all()
    assert (cells["value"] <= cells["ci_high"] + 1e-12).all()
    # the mean over kinds is MIB's unit: its n is every kept pair
    n_all = cells[cells["counterfactual"] == "all"]["n"]
    assert (n_all == int(acc["n_kept"])).all()


@pytest.mark.slow
def test_the_controls_that_are_the_whole_vector_score_as_the_whole_vector(table):
    """The identity featurizer at a site is the whole-vector swap (``vanilla``), and a random rotation of the whole
    vector's dimension spans every direction: all three give the same outputs, so the same IIA in every cell; the
    untrained model is a column of its own."""
    c = table[table["kind"] == "cell"].set_index(["variable", "counterfactual", "layer", "position"])
    van = c[(c["method"] == "vanilla") & (c["control"] == "none")]["value"].sort_index()
    ident = c[(c["method"] == "vanilla") & (c["control"] == "identity")]["value"].sort_index()
    assert np.array_equal(van.to_numpy(), ident.to_numpy())
    rot = c[(c["method"] == "vanilla") & (c["control"] == "rotation")].sort_index()
    # a full orthonormal basis: the same vector up to float rounding, so the same outputs but for a near-tie
    assert (np.abs(rot["value"].to_numpy() - van.to_numpy()) <= 1 / rot["n"].to_numpy() + 1e-12).all()
    das_id = c[(c["method"] == "das") & (c["control"] == "identity")]["value"].sort_index()
    assert np.array_equal(das_id.to_numpy(), van.to_numpy())  # the identity control is the method's site's
    assert (c[c["control"] == "untrained"]["n"] > 0).all()


@pytest.mark.slow
def test_mibs_aggregates_are_the_best_and_the_mean_over_layers_of_the_best_position(table):
    cells = table[(table["kind"] == "cell") & (table["counterfactual"] == "all")]
    summ = table[table["kind"] == "summary"]
    for (v, m, c), g in cells.groupby(["variable", "method", "control"]):
        per_layer = g.groupby("layer")["value"].max()
        s = summ[(summ["variable"] == v) & (summ["method"] == m) & (summ["control"] == c)].set_index("metric")
        assert s.loc["mib_best", "value"] == pytest.approx(per_layer.max())
        assert s.loc["mib_mean", "value"] == pytest.approx(per_layer.mean())


@pytest.mark.slow
def test_records_leaderboard_and_the_exported_submission(job):
    recs = pd.read_parquet(job / "records.parquet")
    assert {"iia", "mib_best", "mib_mean", "task_accuracy"} <= set(recs["metric"])
    assert unregistered(recs["metric"].unique()) == [] and R.problems(recs) == []
    board = pd.read_csv(job / "leaderboard.csv")
    assert {"mib_best", "mib_mean"} <= set(board["metric"])
    r = cli.run("mib", "verify", str(job / "mib_submission" / "das"))
    assert r.returncode == 1 and "Could not identify valid model name" in r.stdout  # MIB's four models only
    r = cli.run("mib", "verify", str(job / "mib_submission" / "das"), "--model", "GPTNeoXForCausalLM")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Perfect submission" in r.stdout and "2 valid triplet(s)" in r.stdout


@pytest.mark.slow
def test_a_model_below_the_accuracy_threshold_is_reported_not_scored(tmp_path):
    r = cli.run("run", "+experiment=mib_tiny", "--smoke", "mib.min_accuracy=0.99", f"paths.output_root={tmp_path}",
                f"hydra.run.dir={tmp_path / 'job'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "below mib.min_accuracy=0.99: reported, not scored" in r.stdout + r.stderr  # in-process: the log's stream
    status = json.loads((tmp_path / "job" / "status.json").read_text())
    assert any("below mib.min_accuracy=0.99" in w for w in status["warnings"])
    t = pd.read_parquet(tmp_path / "job" / "metrics.parquet")
    assert list(t["kind"]) == ["accuracy"] and not t["scored"].iloc[0] and t["value"].iloc[0] < 0.99
    assert "| mib_neox_smoke | mcqa" in (tmp_path / "job" / "mib_results.md").read_text()


@pytest.mark.parametrize("override, message", [
    (["mib.tasks=[mcq]"], "unknown MIB task 'mcq'; choose from ['arc', 'arithmetic', 'ioi', 'mcqa', 'ravel']"),
    (["+mib.variables={mcqa: [colour]}"], "unknown variable 'colour' of MIB task 'mcqa'; choose from"),
    (["+mib.positions={mcqa: [entity_last_token]}"], "unknown token position 'entity_last_token' of MIB task 'mcqa'"),
    (["mib.methods=[fgsm]"], "intervention 'fgsm' cannot run in mib.methods"),
    (["mib.tasks=[arc]"], "MIB task 'arc' reads ARC-Easy questions from a JSONL file"),
])
def test_bad_settings_are_one_line_before_any_model_loads(tmp_path, override, message):
    r = cli.run("run", "+experiment=mib_tiny", *override, f"paths.output_root={tmp_path / 'out'}", cwd=tmp_path)
    cli.assert_refused(r, message, tmp_path / "out")


def test_an_mib_file_that_needs_unpickling_is_one_line(tmp_path):
    import torch

    d = tmp_path / "sub" / "4_answer_MCQA_LlamaForCausalLM_answer"
    d.mkdir(parents=True)
    (d / "ResidualStream(Layer-0,Token-last_token)_indices").write_text("null")
    torch.save({"model_info": {}, "state_dict": {}, "x": np.dtype("float32")},
               d / "ResidualStream(Layer-0,Token-last_token)_featurizer")
    r = cli.run("mib", "verify", str(tmp_path / "sub"))
    cli.assert_refused(r, "not readable with torch.load(weights_only=True)")


def test_collect_reads_mibs_result_json_into_the_leaderboard_and_yardsticks(tmp_path):
    """A directory of MIB's own results (a run's JSON and aggregate_results.py's output) collects like cprobe's runs:
    MIB's aggregates as MIB study records, its baselines under cprobe's names."""
    import json

    def unit(layer, score):
        return {"metadata": {"layer": layer, "position": "last_token"}, "answer": {"average_score": score}}
    run = {"method_name": "DAS", "model_name": "LlamaForCausalLM", "task_name": "4_answer_MCQA",
           "dataset": {"randomLetter_test": {"model_unit": {"u0": unit(0, 0.25), "u1": unit(1, 0.75)}}}}
    (tmp_path / "DAS_results.json").write_text(json.dumps(run))
    agg = {"('full_vector', 'LlamaForCausalLM', '4_answer_MCQA', 'answer')": {"average_accuracy": 0.4,
                                                                           "highest_accuracy": 0.6}}
    (tmp_path / "aggregated_results.json").write_text(json.dumps(agg))
    r = cli.run("collect", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    board = pd.read_csv(tmp_path / "leaderboard.csv")
    got = {(m, k): v for m, k, v in zip(board["method"], board["metric"], board["mean"])}
    assert got == {("das", "mib_best"): 0.75, ("das", "mib_mean"): 0.5, ("vanilla", "mib_best"): 0.6,
                   ("vanilla", "mib_mean"): 0.4}
    y = pd.read_csv(tmp_path / "yardsticks.csv", dtype=str)
    assert set(y["method"]) == {"das", "vanilla"} and "mib: MIB mean over layers ↑ [variable=answer]" in y.columns
