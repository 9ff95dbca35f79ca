"""The yardsticks table: one row per model × layer × method across studies (the method followed through the
registries' bridges), each study's headline cells, the best setting on its deciding metric."""

from __future__ import annotations

import pandas as pd
import pytest

from cprobe import records as R
from cprobe.leaderboard import leaderboard
from cprobe.metrics.registry import METRICS, Metric, metric_problems
from cprobe.yardsticks import deciding_metric, markdown, method_of, yardsticks


@pytest.mark.parametrize("name, family, method", [
    ("probe_direction", "counterfactual", "probe"),  # a direction bridged into an intervention: its direction
    ("mean_direction", "intervention", "mean"),
    ("das", "nullifying", "das"),
    ("probe", "direction", "probe"),
    ("via_probe_direction", "explainer", "probe"),  # an explainer bridged from that intervention: the same method
    ("via_leace", "explainer", "leace"),
    ("leace", "explainer", "leace"),  # the home explainer of the same eraser
    ("leace", "nullifying", "leace"),
    ("leace", "intervention", "leace"),  # AxBench's eraser scored by its edit direction: the same row
    ("probe0", "direction", "probe0"),  # a label no registry knows stays its own
    ("linear", "probe", None),  # a probe's accuracy, an evaluation setting, a classifier: no method on a yardstick
    ("random", "evaluation", None),
    ("explained", "classifier", None),
    ("", "direction", None),
])
def test_a_method_is_followed_through_the_declared_bridges(name, family, method):
    assert method_of(name, family) == method


def test_the_deciding_metric_is_the_declared_one_else_the_first_ranked_headline():
    assert deciding_metric(["oracle_selectivity", "oracle_completeness", "reliability"]) == "reliability"
    assert deciding_metric(["oracle_selectivity", "oracle_completeness"]) == "oracle_completeness"  # registry order
    assert deciding_metric(["icace_error_cosine", "icace_error_l2"]) == "icace_error_l2"
    assert deciding_metric(["delta_task_accuracy"]) is None  # neither direction: nothing to rank by
    for study in {s for m in METRICS.values() for s in m.studies}:
        assert sum(m.decides and study in m.studies for m in METRICS.values()) <= 1, study
    bad = Metric("x", "x", "x", "higher", (0, 1), "x", decides=True)
    assert metric_problems(bad) == ["decides (the study's overall score) needs headline=True"]


def records(rows: list[dict]) -> pd.DataFrame:
    base = {"dataset": "d", "model": "m", "setting": "{}", "slice": "{}", "seed": 0, "config_id": "c"}
    return R.finish(pd.DataFrame([{**base, **r} for r in rows]))


def rel(method: str, layer: int, c: float, s: float, r: float, setting: str = '{"oracle":"mlp"}',
        read_layer: int | None = None) -> list[dict]:
    base = {"study": "reliability", "method": method, "family": "counterfactual", "layer": layer,
            "read_layer": layer if read_layer is None else read_layer, "position": "target", "setting": setting,
            "config_id": f"r{method}{setting}"}
    return [{**base, "metric": m, "value": v}
            for m, v in (("oracle_completeness", c), ("oracle_selectivity", s), ("reliability", r))]


THREE_STUDIES = [
    *rel("probe_direction", 2, 1.0, 0.75, 0.857),
    *rel("probe_direction", 2, 0.0, 0.0, 0.0, read_layer=4),  # a downstream read: the leaderboard's, not here
    *rel("probe_direction", 4, 1.0, 0.5, 0.667),
    *rel("pgd", 2, 0.0, 0.96, 0.0, setting='{"eps":0.1}'),  # ε grid: the row shows the best reliability
    *rel("pgd", 2, 0.6, 0.5, 0.545, setting='{"eps":0.5}'),
    # CausalGym: directions, summarised over layers (layer blank), two seeds of probe
    *[{"study": "causalgym", "method": "probe", "family": "direction", "metric": "overall_odds", "value": v, "seed": s}
      for s, v in ((0, 0.2), (1, 0.4))],
    {"study": "causalgym", "method": "das", "family": "direction", "metric": "overall_odds", "value": 1.5},
    # CEBaB: the probe direction as an explainer; INLP at two task settings (lower is better)
    {"study": "cebab", "method": "via_probe_direction", "family": "explainer", "metric": "icace_error_l2",
     "value": 0.25},
    {"study": "cebab", "method": "inlp", "family": "explainer", "metric": "icace_error_l2", "value": 0.3,
     "setting": '{"cebab_task":"2way"}', "config_id": "c2"},
    {"study": "cebab", "method": "inlp", "family": "explainer", "metric": "icace_error_l2", "value": 0.1,
     "setting": '{"cebab_task":"5way"}', "config_id": "c5"},
    {"study": "probing", "method": "linear", "family": "probe", "read_layer": 2, "metric": "probe_accuracy",
     "value": 0.9},  # a probe's accuracy is no method on a yardstick
]


def test_three_studies_side_by_side_hand_built():
    """The probe direction is one row across the three studies (reliability's probe_direction, CausalGym's probe,
    CEBaB's via_probe_direction); CausalGym's and CEBaB's summaries over layers stand on both of its layers; pgd
    shows ε = 0.5 (reliability 0.545 > 0) in all three of its columns; INLP the 5-way setting (0.1 < 0.3); the two
    CausalGym seeds of probe give Student's t interval 0.3 ± 12.7062 · 0.1414/√2 = 0.3 ± 1.2706."""
    t = yardsticks(leaderboard(records(THREE_STUDIES)))
    odds, err = "causalgym: overall odds-ratio ↑", "cebab: ICaCE-Error (l2) ↓"
    c, s, r = "reliability: completeness ↑", "reliability: selectivity ↑", "reliability: reliability ↑"
    assert list(t.columns) == ["model", "layer", "method", odds, "causalgym: which", err, "cebab: which", c, s, r,
                               "reliability: which"]
    probe_cg = "0.300 [-0.971, 1.571]"
    expected = pd.DataFrame([
        ["m", 2, "pgd", "", "", "", "", "0.600", "0.500", "0.545",
         "counterfactual at target eps=0.5 (best reliability of 2)"],
        ["m", 2, "probe", probe_cg, "(over layers)", "0.250", "via_probe_direction (over layers)", "1.000", "0.750",
         "0.857", "probe_direction counterfactual at target oracle=mlp"],
        ["m", 4, "probe", probe_cg, "(over layers)", "0.250", "via_probe_direction (over layers)", "1.000", "0.500",
         "0.667", "probe_direction counterfactual at target oracle=mlp"],
        ["m", "", "das", "1.500", "", "", "", "", "", "", ""],
        ["m", "", "inlp", "", "", "0.100", "cebab_task=5way (best ICaCE-Error (l2) of 2)", "", "", "", ""],
    ], columns=t.columns)
    pd.testing.assert_frame_equal(t.astype(str), expected.astype(str))
    # the same records in another order: the same table
    again = yardsticks(leaderboard(records(THREE_STUDIES[::-1])))
    pd.testing.assert_frame_equal(t, again)
    md = markdown(t, ["t over seeds (no per-item values) (95%, 1 df)"])
    assert md.startswith("# Yardsticks side by side") and "| m       |       2 | probe " in md
    assert "t over seeds (no per-item values) (95%, 1 df)" in md


def test_a_slice_is_a_column_and_nothing_on_a_yardstick_is_an_empty_table():
    """AxBench-like records: one AUROC per concept (slice), a column each; a study on two datasets names them."""
    rows = [{"study": "detect", "dataset": ds, "method": "mean", "family": "direction", "layer": 1, "read_layer": 1,
             "slice": f'{{"concept":"{k}"}}', "metric": "oracle_completeness", "value": v}
            for ds, k, v in (("a", "food", 0.9), ("a", "price", 0.7), ("b", "food", 0.8))]
    t = yardsticks(leaderboard(records(rows)))
    assert list(t.columns) == ["model", "layer", "method", "detect: completeness ↑ (a) [concept=food]",
                               "detect: completeness ↑ (a) [concept=price]", "detect: completeness ↑ (b) [concept=food]"]
    assert t.iloc[0].tolist() == ["m", 1, "mean", "0.900", "0.700", "0.800"]
    # two poolings (a setting): the one with the better mean over the concepts, 0.75 > 0.7, though the other has the
    # best single concept (0.9)
    rows = [{"study": "detect", "method": "mean", "family": "direction", "layer": 1, "read_layer": 1,
             "setting": f'{{"pooling":"{p}"}}', "slice": f'{{"concept":"{k}"}}', "metric": "oracle_completeness",
             "value": v} for p, k, v in (("max", "food", 0.9), ("max", "price", 0.5), ("avg", "food", 0.8),
                                         ("avg", "price", 0.7))]
    t = yardsticks(leaderboard(records(rows)))
    assert t.iloc[0].tolist() == ["m", 1, "mean", "0.800", "0.700", "pooling=avg (best completeness of 2)"]
    empty = yardsticks(leaderboard(records([THREE_STUDIES[-1]])))
    assert empty.empty and "No method on a yardstick" in markdown(empty)


def test_collect_writes_the_table_and_the_page_shows_it(tmp_path):
    """``yardsticks.{csv,md}`` as collect writes them, and the report's section read back from the CSV."""
    from cprobe.outputs import write_leaderboard, write_yardsticks
    from cprobe.report import render

    board = leaderboard(records(THREE_STUDIES))
    write_leaderboard(board, tmp_path)
    write_yardsticks(board, tmp_path)
    back = pd.read_csv(tmp_path / "yardsticks.csv", dtype=str, keep_default_na=False)
    pd.testing.assert_frame_equal(back, yardsticks(board).astype(str))
    assert "t over seeds (no per-item values) (95%, 1 df)" in (tmp_path / "yardsticks.md").read_text()
    page = render(tmp_path)
    assert 'id="yardsticks"' in page and "Yardsticks side by side" in page
    assert "via_probe_direction (over layers)" in page and "0.300 [-0.971, 1.571]" in page
    (tmp_path / "yardsticks.csv").unlink()  # a job's page (no yardsticks written): no section
    assert "Yardsticks side by side" not in render(tmp_path)
