"""The AxBench detection study end to end at smoke size (issue 46 item 4): ``cprobe run +experiment=axbench_detect``
on the tiny causal LM, in process (tests.cli.run), and its bad input as one line before any model pass."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests import cli

RUN = ["run", "+experiment=axbench_detect", "+debug=smoke", "layers=[0,2,4]"]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("axbench")
    r = cli.run(*RUN, f"paths.output_root={root}", cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    (status,) = root.rglob("status.json")
    return status.parent


@pytest.mark.slow
@pytest.mark.numeric  # AUROC bounds through the tiny model trained on this CPU's kernels
def test_every_method_layer_and_pooling_gets_an_auroc(job):
    t = pd.read_parquet(job / "metrics.parquet")
    assert set(t["method"]) == {"mean", "probe", "pca", "lda", "kmeans", "random"}
    assert set(t["layer"]) == {0, 2, 4} and set(t["pooling"]) == {"max", "mean", "last"} and len(t) == 6 * 3 * 3
    assert set(t["concept"]) == {"z_c=pl"} and (t["n_test"] == 120).all()  # +debug=smoke: axbench.max_test
    assert t["auroc"].between(0, 1).all()
    at = t.set_index(["layer", "method", "pooling"])["auroc"]
    # subject number is read at the last prefix token of the tiny causal LM (the agreement position): DiffMean and
    # the probe find it there at the last layer (measured 1.000; the bound leaves room for other CPUs' training)
    assert at[(4, "mean", "last")] > 0.95 and at[(4, "probe", "last")] > 0.95
    assert at[(4, "random", "max")] < at[(4, "mean", "max")]
    recs = pd.read_parquet(job / "records.parquet")
    assert set(recs["metric"]) == {"detection_auroc"} and len(recs) == len(t)
    assert (job / "auroc_by_layer.png").is_file()


@pytest.mark.parametrize("override, message", [
    ("axbench.test_share=0.001", "concept 'z_c=pl' has one class in the held-out (test_share=0.001) split"),
    ("axbench.concepts=[z_c=dual]", "concept 'z_c=dual' has one class in the training split"),
    ("axbench.concepts=[zz=pl]", "axbench.concepts: unknown property ['zz'] for dataset 'synthetic_sva'"),
    ("axbench.concepts=[z_c]", "'z_c' is not name=value or name!=value"),
    ("axbench.methods=[das]", "direction method 'das' is trained through the model on minimal pairs (causal)"),
    ("axbench.methods=[vanilla]", "direction method 'vanilla' learns no direction (whole_vector)"),
    ("axbench.methods=[nope]", "unknown direction method 'nope'; choose from"),
    ("axbench.poolings=[min]", "unknown axbench.poolings ['min']; choose from ['max', 'mean', 'last']"),
    ("+axbench.params.probe.lam=-1", "direction method 'probe': probe lam must be > 0, got -1"),
    ("+axbench.params.das.lr=0.1", "axbench.params sets ['das'], which axbench.methods does not list"),
])
def test_bad_input_is_one_line_and_leaves_nothing(override, message, tmp_path):
    r = cli.run(*RUN, override, f"paths.output_root={tmp_path}", cwd=tmp_path)
    cli.assert_refused(r, message, tmp_path)
