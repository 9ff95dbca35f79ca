"""Helpers of the reliability task (cprobe.tasks.reliability): targets, selectivity aggregation, Table 1."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.metrics.reliability import (
    counterfactual_completeness,
    reliability,
    selectivity,
)
from cprobe.probes import build_probe
from cprobe.tasks.reliability import (
    _memo_probe,
    aggregate_selectivity,
    counterfactual_targets,
    report,
    table1,
)

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
    return {"model": "m", "layer": 4, "oracle_probe": "mlp", "method": method, "kind": kind, "hparam": hparam,
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
    from cprobe.tasks import reliability as rel

    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 4, generator=g)
    y = (X[:, 0] > 0).long()
    cfg = {"name": "linear", "lrs": [0.1], "epochs": 2, "batch_size": 16, "seed": 0}
    key = {"test": "memo", "probe": cfg}
    rel._MEMO.clear()
    p1, src1 = _memo_probe(key, cfg, X, y, tmp_path)
    p2, src2 = _memo_probe(key, cfg, X, y, tmp_path)
    rel._MEMO.clear()
    p3, src3 = _memo_probe(key, cfg, X, y, tmp_path)
    assert (src1, src2, src3) == ("fit", "memory", "disk")
    assert p2 is p1 and p3 is not p1
    assert torch.equal(p3.predict_proba(X), p1.predict_proba(X))
    rel._MEMO.clear()
    assert math.isclose(build_probe(cfg).fit(X, y).score(X, y), p1.score(X, y))
