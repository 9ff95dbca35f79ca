"""The reliability study end to end on the tiny BERT (smoke sizes): every method runs, metrics are sane."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.smoke.test_e2e import REPO, cprobe

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
