"""The reliability study end to end on the tiny BERT (smoke sizes): every method runs, metrics are sane."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.cli import REPO
from tests.cli import run as cprobe

pytestmark = pytest.mark.slow


def test_reliability_methods_smoke(tmp_path):
    r = cprobe("run", "-m", "+experiment=sva_tiny_reliability",
               "intervention=inlp,rlace,alterrep,leace,mean_diff,fgsm,pgd,autoattack,das,mean_direction",
               "--smoke", f"hydra.sweep.dir={tmp_path}", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    t = pd.read_csv(tmp_path / "results.csv")
    assert sorted(t["method"]) == sorted(["inlp", "rlace", "alterrep", "leace", "mean_diff", "fgsm", "pgd",
                                          "autoattack", "das", "mean_direction"])  # directions as interventions too
    for col in ("completeness", "selectivity", "reliability"):
        assert t[col].between(0, 1).all(), t[["method", col]]
    assert t["task_acc_before"].notna().all() and t["oracle_acc_z_c"].notna().all()
    assert (tmp_path / "table1.md").is_file() and (tmp_path / "fig1_tradeoffs.png").is_file()


def test_identity_intervention_through_the_whole_study(tmp_path):
    """mean_diff with alpha = 0 changes nothing: S = 1 and ΔTask Acc = 0 exactly, through the real task wiring
    (the oracles read original and intervened states; the states are written back into the model)."""
    r = cprobe("run", "+experiment=sva_tiny_reliability", "intervention=mean_diff", "intervention.alpha=0",
               "--smoke", f"paths.output_root={tmp_path}", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    (f,) = list(tmp_path.rglob("metrics.parquet"))
    row = pd.read_parquet(f).iloc[0]
    assert row["selectivity"] == pytest.approx(1.0) and row["delta_task_acc"] == 0.0
    assert row["task_acc_before"] == row["task_acc_after"] > 0.9
    # unchanged states: the (informative) oracle still prefers the true value, so z' gets less than half
    assert row["completeness"] < 0.5 and bool(row["oracle_informative_z_c"])


# The one schema of a reliability row, whatever the job edits and reads (issue 45: the plain switch is gone; its values
# are pinned by tests/integration/test_sites_golden.py).
COLUMNS = [
    "model", "dataset", "dataset_source", "layer", "read_layer", "sites", "target", "mode", "position", "method",
    "kind", "hparam", "hparam_value", "completeness", "selectivity", "reliability", "selectivity_z_e",
    "task_acc_before", "task_acc_after", "delta_task_acc", "oracle_acc_edited_z_c", "oracle_acc_edited_z_e",
    "selectivity_valid", "oracle_acc_z_c", "oracle_majority_z_c", "oracle_informative_z_c", "oracle_acc_z_e",
    "oracle_majority_z_e", "oracle_informative_z_e", "oracle_probe", "n_test", "n_scored", "n_oracle",
    "n_intervention", "device"]


def test_read_layers_and_sites_through_the_cli(tmp_path):
    """LEACE at layer 2 (and at layers 2+3, refitted sequentially), read at the edited layer only or at every l′:
    every job's rows have one schema; read at its own layer the downstream job scores exactly what the job read
    there only does; ΔTask is one value per edit; the sweep writes the l × l′ table and heat-map."""
    r = cprobe("run", "-m", "+experiment=sva_tiny_reliability", "intervention=leace", "layers=2",
               "reliability.oracle_probe=linear", "reliability.read_layers=null,all", "reliability.sites=null,[2,3]",
               "reliability.mode=sequential", "--smoke", f"hydra.sweep.dir={tmp_path}", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = [pd.read_parquet(p) for p in tmp_path.glob("*/metrics.parquet")]
    assert len(jobs) == 4
    for t in jobs:  # one row schema, then the pipeline's columns (task, seed, ...)
        assert [c for c in t.columns if not c.endswith("_s")][:len(COLUMNS)] == COLUMNS
    (plain,) = [t for t in jobs if (t["mode"] == "single").all() and len(t) == 1]
    assert plain["read_layer"].tolist() == [2] and plain["sites"].tolist() == ["2"]
    (down,) = [t for t in jobs if (t["mode"] == "single").all() and len(t) > 1]
    assert down["read_layer"].tolist() == [2, 3, 4] and (down["layer"] == 2).all()
    same = down[down["read_layer"] == 2].iloc[0]
    for col in ("completeness", "selectivity", "reliability", "oracle_acc_z_c", "oracle_acc_z_e", "delta_task_acc"):
        assert same[col] == pytest.approx(plain[col].iloc[0], abs=1e-6), col
    assert down["delta_task_acc"].nunique() == 1
    assert (down["oracle_acc_edited_z_c"].iloc[1:] > down["oracle_acc_edited_z_c"].iloc[0]).all()  # it comes back
    seq = sorted((t for t in jobs if (t["mode"] == "sequential").all()), key=len)
    assert [t["read_layer"].tolist() for t in seq] == [[3], [3, 4]]  # null: the deepest edited layer
    assert all((t["sites"] == "2,3").all() and (t["layer"] == 3).all() for t in seq)
    for col in ("completeness", "oracle_acc_edited_z_c", "delta_task_acc"):
        assert seq[0][col].iloc[0] == pytest.approx(seq[1][col].iloc[0], abs=1e-6), col
    assert (tmp_path / "read_layers.md").is_file() and (tmp_path / "fig_read_layers.png").is_file()
    from tests.conftest import assert_figures_captioned

    assert tmp_path / "fig_read_layers.png" in assert_figures_captioned(tmp_path)
    recs = pd.read_parquet(tmp_path / "records.parquet")  # the records read each l′ with that l′'s oracles
    edited = recs[(recs["metric"] == "edited_oracle_accuracy") & (recs["layer"] == 2)
                  & (recs["slice"] == '{"property":"z_c"}')]
    assert sorted(edited["read_layer"]) == [2, 2, 3, 4]  # the job read at layer 2 only, and the downstream job
    items = pd.read_parquet(tmp_path / "record_items.parquet")
    per = items[(items["layer"] == 2) & (items["metric"] == "oracle_completeness")].groupby("read_layer")["value"]
    assert per.size().to_dict() == {2: 160, 3: 80, 4: 80}  # l′ = 2: both single-site jobs' items
