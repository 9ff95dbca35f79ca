"""The leaderboard's bootstrap intervals (hand-computed cases), which records it shows, and its order."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cprobe import records as R
from cprobe.leaderboard import CI_TEXT, cell_text, headline, interval, leaderboard, markdown, wide


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_one_seed_without_items_has_no_interval():
    lo, hi, kind = interval(np.array([0.7]), None, rng=rng())
    assert np.isnan(lo) and np.isnan(hi) and kind == "none"


def test_seeds_without_items_get_a_t_interval_hand_computed():
    """[0, 1]: mean 0.5, sd 1/√2, t(0.975, 1 df) = 12.7062, so 0.5 ± 12.7062 · (1/√2)/√2 = 0.5 ± 6.3531 — a 95%
    interval, where resampling two seeds gave exactly their min–max; equal seeds give a zero-width one."""
    lo, hi, kind = interval(np.array([0.0, 1.0]), None, n_boot=20000, rng=rng())
    assert (lo, hi, kind) == (pytest.approx(0.5 - 6.353102), pytest.approx(0.5 + 6.353102), "seeds")
    lo, hi, _ = interval(np.array([0.2, 0.2, 0.2]), None, rng=rng())
    assert (lo, hi) == (pytest.approx(0.2), pytest.approx(0.2))


def test_items_of_one_seed_hand_computed():
    """Items [0, 0, 0, 1]: P(mean >= 0.75) = 4·0.25³·0.75 + 0.25⁴ ≈ 0.051 > 0.025 and P(mean = 1) ≈ 0.004 < 0.025, so
    the 97.5% quantile is 0.75; P(mean = 0) = 0.75⁴ ≈ 0.32, so the 2.5% quantile is 0."""
    lo, hi, kind = interval(np.array([0.25]), [np.array([0.0, 0.0, 0.0, 1.0])], n_boot=20000, rng=rng())
    assert (lo, hi, kind) == (0.0, 0.75, "items")


def test_seeds_and_items_resample_both_levels():
    # constant items within each seed: only the seed level varies, as over seeds alone
    lo, hi, kind = interval(np.array([1.0, 3.0]), [np.array([1.0, 1.0]), np.array([3.0, 3.0])], n_boot=20000,
                            rng=rng())
    assert (lo, hi, kind) == (1.0, 3.0, "seeds+items")
    # equal seeds: only the items vary, and the interval is wider than none at all
    lo, hi, _ = interval(np.array([0.5, 0.5]), [np.array([0.0, 1.0])] * 2, n_boot=4000, rng=rng())
    assert 0.0 <= lo < 0.5 < hi <= 1.0


def test_a_seed_drawn_once_still_gets_its_items_resampled():
    """One bootstrap draw of one seed: seed 0 is drawn exactly once (count 1), and its constant items [0.25, 0.25]
    give the draw mean 0.25, so the interval is (0.25, 0.25). Kills a skip of seeds drawn once (the draw's mean
    would stay uninitialised)."""
    lo, hi, kind = interval(np.array([0.25]), [np.array([0.25, 0.25])], n_boot=1, rng=rng())
    assert (lo, hi, kind) == (0.25, 0.25, "items")


def test_one_item_per_seed_is_not_an_item_bootstrap():
    lo, hi, kind = interval(np.array([0.4]), [np.array([0.4])], rng=rng())
    assert kind == "none" and np.isnan(lo)


def test_intervals_are_seeded_and_narrow_with_more_items():
    x = np.random.default_rng(1).normal(size=400)
    a = interval(np.array([x.mean()]), [x], rng=rng(5))
    assert a == interval(np.array([x.mean()]), [x], rng=rng(5))
    small = interval(np.array([x[:20].mean()]), [x[:20]], rng=rng(5))
    assert a[1] - a[0] < small[1] - small[0]
    assert a[0] < x.mean() < a[1]


def records(rows: list[dict]) -> pd.DataFrame:
    base = {"study": "s", "dataset": "d", "model": "m", "method": "a", "setting": "{}", "slice": "{}", "seed": 0,
            "config_id": "c"}
    return R.finish(pd.DataFrame([{**base, **r} for r in rows]))


def test_the_leaderboard_shows_headline_metrics_of_whole_sets_best_first():
    recs = records([
        {"method": "a", "metric": "icace_error_l2", "value": 0.3, "seed": 0},
        {"method": "a", "metric": "icace_error_l2", "value": 0.5, "seed": 1},
        {"method": "b", "metric": "icace_error_l2", "value": 0.1, "seed": 0},
        {"method": "b", "metric": "icace_error_l2", "value": 0.1, "seed": 1},
        {"method": "b", "metric": "icace_error_l2", "value": 0.9, "slice": '{"aspect":"food"}'},  # a breakdown
        {"method": "b", "metric": "ate", "value": 1.0},  # not a headline metric
        {"method": "a", "metric": "reliability", "value": 0.2},
        {"method": "b", "metric": "reliability", "value": 0.6},
    ])
    assert len(headline(recs, {"s": ("aspect",)})) == 6
    board = leaderboard(recs, breakdowns={"s": ("aspect",)}, variants={"c": "x=1"})
    err = board[board["metric"] == "icace_error_l2"]
    assert list(err["method"]) == ["b", "a"]  # lower is better
    assert err["mean"].tolist() == pytest.approx([0.1, 0.4]) and err["seeds"].tolist() == [2, 2]
    assert set(err["ci"]) == {CI_TEXT["seeds"] + " (95%, 1 df)"}
    rel = board[board["metric"] == "reliability"]
    assert list(rel["method"]) == ["b", "a"] and rel["ci_low"].isna().all()  # higher is better; one seed
    assert set(board["variant"]) == {"x=1"} and set(board["direction"]) == {"lower", "higher"}
    # the same records in another order: the same table
    again = leaderboard(recs.iloc[::-1].reset_index(drop=True), breakdowns={"s": ("aspect",)}, variants={"c": "x=1"})
    pd.testing.assert_frame_equal(board, again)


def test_per_item_values_join_their_records_by_key():
    recs = records([{"metric": "icace_error_l2", "value": 0.25, "seed": s} for s in (0, 1)])
    items = pd.concat([R.item_rows(recs[recs["seed"] == s], {"icace_error_l2": [0.0, 0.0, 0.0, 1.0]},
                                   ["p1", "p2", "p3", "p4"]) for s in (0, 1)])
    board = leaderboard(recs, items)
    row = board.iloc[0]
    assert row["items"] == 4 and row["ci"].startswith(CI_TEXT["seeds+items"])
    assert row["ci_low"] == 0.0 and 0.25 < row["ci_high"] <= 0.75


def test_wide_tables_and_markdown_state_the_interval():
    recs = records([{"method": m, "metric": "reliability", "value": v, "seed": s}
                    for m, v in (("a", 0.2), ("b", 0.6)) for s in (0, 1)])
    board = leaderboard(recs)
    (name, t), = wide(board).items()
    assert name == "s · d" and list(t.columns) == ["model", "method", "seeds", "reliability ↑"]
    assert t["reliability ↑"].tolist() == ["0.600 [0.600, 0.600]", "0.200 [0.200, 0.200]"]
    md = markdown(board)
    assert "## s · d" in md and "t over seeds (no per-item values)" in md
    assert cell_text(0.000123, 0.0001, 0.0002) == "0.000123 [0.0001, 0.0002]"
    assert cell_text(45.25, 40.0, 50.0) == "45.250 [40.000, 50.000]" and cell_text(np.nan, 0, 1) == "n/a"
    assert cell_text(0.0, 0.0, 0.0) == "0 [0, 0]"  # an exact zero (a zero reference) prints as 0, no decimals


def test_a_plugin_methods_source_is_shown_and_built_in_ones_are_not():
    """The cell's source is its first non-blank record source; the wide table has a source column only when some
    method comes from outside cprobe (not "built-in")."""
    rows = [{"method": "a", "metric": "reliability", "value": 0.5, "seed": s, "source": "built-in"} for s in (0, 1)]
    plugin = [{"method": "b", "metric": "reliability", "value": 0.5, "seed": 0, "source": ""},
              {"method": "b", "metric": "reliability", "value": 0.5, "seed": 1, "source": "pkg.mod:B"}]
    board = leaderboard(records(rows + plugin))
    assert dict(zip(board["method"], board["source"])) == {"a": "built-in", "b": "pkg.mod:B"}
    (_, t), = wide(board).items()
    assert list(t.columns) == ["model", "method", "source", "seeds", "reliability ↑"]
    assert t["source"].tolist() == ["built-in", "pkg.mod:B"]
    (_, t), = wide(leaderboard(records(rows))).items()
    assert list(t.columns) == ["model", "method", "seeds", "reliability ↑"]
