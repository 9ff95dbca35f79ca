"""Helpers of the reliability task (cprobe.tasks.reliability): targets, selectivity aggregation, Table 1."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.metrics.reliability import (
    aggregate_selectivity,
    counterfactual_completeness,
    counterfactual_targets,
    oracle_informative,
    reliability,
    score_intervention,
    selectivity,
)
from cprobe.probes import build_probe
from cprobe.tasks.reliability import report, table1
from cprobe.tasks.sites import memo_probe

NAN = float("nan")


def test_counterfactual_targets_binary_flips_each_row_once():
    rows, goal = counterfactual_targets(torch.tensor([0, 1, 1, 0]), 2)
    assert rows.tolist() == [0, 1, 2, 3]
    assert goal.tolist() == [1, 0, 0, 1]


def test_counterfactual_targets_k3_every_other_value_once():
    z = torch.tensor([0, 2])
    rows, goal = counterfactual_targets(z, 3)
    assert rows.tolist() == [0, 0, 1, 1]
    pairs = sorted(zip(rows.tolist(), goal.tolist()))
    assert pairs == [(0, 1), (0, 2), (1, 0), (1, 1)]
    assert (goal != z[rows]).all()


def test_counterfactual_targets_rejects_k1():
    with pytest.raises(ConfigError):
        counterfactual_targets(torch.tensor([0, 0]), 1)


def test_k3_completeness_is_the_per_row_average_over_goals():
    # Row 0 (z=0) has copies for z'=1 (oracle gives 0.6 to class 1) and z'=2 (0.2 to class 2):
    # c = (0.6 + 0.2) / 2 = 0.4; row 1 (z=1) copies: z'=2 -> 1.0, z'=0 -> 0.0: c = 0.5.
    z = torch.tensor([0, 1])
    rows, goal = counterfactual_targets(z, 3)
    p_hat = torch.tensor([[0.2, 0.6, 0.2], [0.1, 0.7, 0.2], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    c = counterfactual_completeness(p_hat, goal)
    per_row = torch.zeros(2).index_add_(0, rows, c) / 2
    assert per_row.tolist() == pytest.approx([0.4, 0.5])
    assert c.mean().item() == pytest.approx(0.45)  # equal copies per row: mean of copies = mean of rows


def test_selectivity_one_property_hand_computed():
    # P = (0.8, 0.2): m = max(1 - 0.2, 0.8) = 0.8; P̂ = (0.4, 0.6): δ = 0.4 -> s = 1 - 0.4/0.8 = 0.5.
    p = torch.tensor([[0.8, 0.2], [0.5, 0.5]])
    p_hat = torch.tensor([[0.4, 0.6], [0.5, 0.5]])
    s = selectivity(p_hat, p, torch.tensor([True, False]))
    S, per = aggregate_selectivity({"z_e": s})
    assert S == pytest.approx(0.5) and per == {"z_e": pytest.approx(0.5)}


def test_selectivity_averages_applicable_properties_per_row_then_rows():
    a = torch.tensor([1.0, 0.0, NAN])
    b = torch.tensor([0.5, NAN, NAN])
    S, per = aggregate_selectivity({"a": a, "b": b})
    # rows: (1 + 0.5)/2 = 0.75, 0.0 (only a applies), no property -> excluded
    assert S == pytest.approx((0.75 + 0.0) / 2)
    assert per == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}


def test_selectivity_never_skips_a_property():
    with pytest.raises(ConfigError, match="apply to no test row"):
        aggregate_selectivity({"a": torch.tensor([1.0]), "b": torch.tensor([NAN])})
    with pytest.raises(ConfigError):
        aggregate_selectivity({})


def _row(method, kind, hparam, value, c, s, dtask=0.1, **extra):
    return {"model": "m", "dataset": "d", "target": "z_c", "n_test": 600, "seed": 0,
            "layer": 4, "oracle_probe": "mlp", "method": method, "kind": kind, "hparam": hparam,
            "hparam_value": value, "completeness": c, "selectivity": s, "reliability": float(reliability(c, s)),
            "task_acc_before": 1.0, "task_acc_after": 1.0 - dtask, "delta_task_acc": dtask,
            "oracle_acc_z_c": 0.99, "oracle_acc_z_e": 0.8, **extra}


def _table():
    return pd.DataFrame([
        _row("pgd", "counterfactual", "eps", 0.1, 0.5, 0.9),
        _row("pgd", "counterfactual", "eps", 0.5, 0.9, 0.8),   # best PGD: R = 2·.72/1.7
        _row("pgd", "counterfactual", "eps", 5.0, 1.0, 0.2),
        _row("inlp", "nullifying", "rank", 0.0, 0.0, 1.0),
        _row("inlp", "nullifying", "rank", 8.0, 0.4, 0.8),    # best INLP
        _row("leace", "nullifying", None, None, 0.3, 0.9),
        _row("alterrep", "counterfactual", "alpha", 1.0, 1.0, 0.9),
        _row("alterrep", "counterfactual", "alpha", 0.0, 0.1, 0.95),
    ])


def test_table1_picks_max_reliability_per_method_and_orders_by_kind():
    t = table1(_table())
    assert list(t["method"]) == ["alterrep", "pgd", "inlp", "leace"]
    pgd = t[t["method"] == "pgd"].iloc[0]
    assert pgd["x_opt"] == "eps=0.5" and pgd["completeness"] == 0.9
    assert pgd["reliability"] == pytest.approx(2 * 0.9 * 0.8 / 1.7)
    assert t.loc[t["method"] == "inlp", "x_opt"].item() == "rank=8"
    assert t.loc[t["method"] == "leace", "x_opt"].item() == "-"  # hparam: null
    assert {"oracle_acc_z_c", "oracle_acc_z_e", "delta_task_acc"} <= set(t.columns)


def test_table1_separates_models_and_layers():
    t = _table()
    t2 = t.assign(layer=2, completeness=t["completeness"] / 2)
    assert len(table1(pd.concat([t, t2]))) == 8


def test_report_writes_table1_and_figures(tmp_path):
    report(_table(), tmp_path)
    assert (tmp_path / "table1.md").read_text().count("\n") == 2 + 4
    for f in ("fig1_tradeoffs.png", "fig2_gbi_metrics_vs_hparam.png", "fig3_linear_counterfactual_metrics_vs_hparam.png",
              "fig4_nullifying_metrics_vs_hparam.png"):
        assert (tmp_path / f).is_file(), f


def test_report_single_job_writes_no_figures(tmp_path):
    report(_table().iloc[:1], tmp_path)
    assert (tmp_path / "table1.md").is_file() and not (tmp_path / "fig1_tradeoffs.png").exists()


def test_memo_probe_disk_cache_round_trip(tmp_path):
    from cprobe.tasks import sites as rel

    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 4, generator=g)
    y = (X[:, 0] > 0).long()
    cfg = {"name": "linear", "lrs": [0.1], "epochs": 2, "batch_size": 16, "seed": 0}
    key = {"test": "memo", "probe": cfg}
    rel._MEMO.clear()
    p1, src1 = memo_probe(key, build_probe(cfg), X, y, tmp_path)
    p2, src2 = memo_probe(key, build_probe(cfg), X, y, tmp_path)
    rel._MEMO.clear()
    p3, src3 = memo_probe(key, build_probe(cfg), X, y, tmp_path)
    assert (src1, src2, src3) == ("fit", "memory", "disk")
    assert p2 is p1 and p3 is not p1
    assert torch.equal(p3.predict_proba(X), p1.predict_proba(X))
    rel._MEMO.clear()
    assert math.isclose(build_probe(cfg).fit(X, y).score(X, y), p1.score(X, y))


class _Nearest:
    """An oracle with known probabilities: class c with probability 0.9 for the rows nearest centroid c."""

    def __init__(self, centroids: torch.Tensor) -> None:
        self.centroids = centroids

    def predict_proba(self, X: torch.Tensor) -> torch.Tensor:
        c = torch.cdist(X, self.centroids).argmin(1)
        k = len(self.centroids)
        p = torch.full((len(X), k), 0.1 / (k - 1))
        p[torch.arange(len(X)), c] = 0.9
        return p


def _toy():
    """Z_c on axis 0, Z_e on axis 1; four rows, one per (z_c, z_e) cell."""
    zc = torch.tensor([0, 0, 1, 1])
    ze = torch.tensor([0, 1, 0, 1])
    X = torch.stack([zc.float() * 2 - 1, ze.float() * 2 - 1], 1)
    oracles = {"z_c": _Nearest(torch.tensor([[-1.0, 0.0], [1.0, 0.0]])),
               "z_e": _Nearest(torch.tensor([[0.0, -1.0], [0.0, 1.0]]))}
    return X, zc, ze, oracles


def test_identity_intervention_is_perfectly_selective_and_leaves_the_task_unchanged():
    X, zc, ze, oracles = _toy()
    out = score_intervention(oracles, "z_c", ["z_e"], X, X.clone(), 1 - zc, {"z_e": torch.ones(4, dtype=torch.bool)},
                             task_acc_before=0.75, task_acc_after=0.75)
    assert out["selectivity"] == pytest.approx(1.0) and out["selectivity_z_e"] == pytest.approx(1.0)
    assert out["delta_task_acc"] == 0.0
    assert out["completeness"] == pytest.approx(0.1)  # the oracle still gives the goal z' only 0.1


def test_centroid_swap_has_known_completeness_and_keeps_z_e():
    """Moving every row to the other Z_c centroid (axis 0 flipped, axis 1 kept): C = P(z') = 0.9, S = 1."""
    X, zc, ze, oracles = _toy()
    X_new = X * torch.tensor([-1.0, 1.0])
    out = score_intervention(oracles, "z_c", ["z_e"], X, X_new, 1 - zc, {"z_e": torch.ones(4, dtype=torch.bool)})
    assert out["completeness"] == pytest.approx(0.9) and out["selectivity"] == pytest.approx(1.0)
    assert out["reliability"] == pytest.approx(2 * 0.9 / 1.9)
    assert "delta_task_acc" not in out


def test_selectivity_compares_the_intervened_with_the_original_states():
    """An intervention that also flips Z_e: P̂ = (0.1, 0.9) vs P = (0.9, 0.1): δ = 0.8, m = 0.9, s = 1 − 0.8/0.9."""
    X, zc, ze, oracles = _toy()
    out = score_intervention(oracles, "z_c", ["z_e"], X, -X, 1 - zc, {"z_e": torch.ones(4, dtype=torch.bool)})
    assert out["selectivity"] == pytest.approx(1 - 0.8 / 0.9)


def test_nullifying_completeness_and_rows_where_z_e_does_not_apply():
    X, zc, ze, oracles = _toy()
    applies = torch.tensor([True, False, True, False])
    X_new = X * torch.tensor([0.0, 1.0])  # on the Z_c boundary: both centroids equally near, argmin picks 0
    out = score_intervention(oracles, "z_c", ["z_e"], X, X_new, None, {"z_e": applies})
    # p̂ = (0.9, 0.1) for every row: 1 − 2·δ(p̂, U) = 1 − 2·0.4 = 0.2
    assert out["completeness"] == pytest.approx(0.2)
    assert out["selectivity"] == pytest.approx(1.0)


def test_delta_task_acc_is_accuracy_before_minus_after():
    X, zc, ze, oracles = _toy()
    out = score_intervention(oracles, "z_c", ["z_e"], X, X, 1 - zc, {"z_e": torch.ones(4, dtype=torch.bool)},
                             task_acc_before=0.98, task_acc_after=0.18)
    assert out["delta_task_acc"] == pytest.approx(0.80)  # the intervention broke agreement: positive


def test_oracle_at_chance_is_flagged():
    assert oracle_informative(0.90, 0.50) and not oracle_informative(0.51, 0.50)
    assert not oracle_informative(0.635, 0.635)


def test_per_row_scores_are_the_items_c_and_s_average():
    """The rows handed back for the leaderboard's item bootstrap: their means are C and S (rows where no
    non-targeted property applies are NaN and left out, as in S)."""
    X, zc, ze, oracles = _toy()
    applies = torch.tensor([True, False, True, True])
    X_new = X * torch.tensor([-1.0, 1.0])
    X_new[0] = -X[0]  # row 0 also flips Z_e
    rows: dict = {}
    out = score_intervention(oracles, "z_c", ["z_e"], X, X_new, 1 - zc, {"z_e": applies}, rows=rows)
    assert rows["completeness"].tolist() == pytest.approx([0.9] * 4)
    assert rows["selectivity"][0].item() == pytest.approx(1 - 0.8 / 0.9) and rows["selectivity"][1].isnan()
    assert rows["completeness"].mean().item() == pytest.approx(out["completeness"])
    assert torch.nanmean(rows["selectivity"]).item() == pytest.approx(out["selectivity"])
