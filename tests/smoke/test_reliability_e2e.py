"""The reliability study end to end on the tiny BERT (smoke sizes): every method runs, metrics are sane."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.smoke.test_e2e import REPO, cprobe

pytestmark = pytest.mark.slow


def test_reliability_methods_smoke(tmp_path):
    r = cprobe("run", "-m", "+experiment=sva_tiny_reliability",
               "intervention=inlp,rlace,alterrep,leace,mean_diff,fgsm,pgd,autoattack",
               "--smoke", f"hydra.sweep.dir={tmp_path}", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    t = pd.read_csv(tmp_path / "results.csv")
    assert sorted(t["method"]) == sorted(["inlp", "rlace", "alterrep", "leace", "mean_diff", "fgsm", "pgd",
                                          "autoattack"])
    for col in ("completeness", "selectivity", "reliability"):
        assert t[col].between(0, 1).all(), t[["method", col]]
    assert t["task_acc_before"].notna().all() and t["oracle_acc_z_c"].notna().all()
    assert (tmp_path / "table1.md").is_file() and (tmp_path / "fig1_tradeoffs.png").is_file()
