"""The leaderboard's survivors of the mutation pass (issue 30, scripts/mutation.py), each pinned by a value: the
bootstrap recomputed draw by draw from the same seeded stream, NaN seeds, defaults, the wide table's cells, seeds
and variants, the number formats."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cprobe import records as R
from cprobe.leaderboard import CI_TEXT, cell_text, interval, leaderboard, markdown, number, wide

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)


def _quantiles(stats: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(stats, [0.025, 0.975])
    return float(lo), float(hi)


def test_one_seeds_item_bootstrap_recomputed_draw_by_draw():
    """n_boot = 3 resamples of 5 items from the cell's stream: row r of rng.integers(0, 5, (3, 5)) indexes the items,
    each row's mean is one statistic, the interval their 2.5% / 97.5% quantiles (np.quantile's linear rule)."""
    x = np.array([0.1, 0.7, 0.2, 0.9, 0.4])
    got = interval(np.array([x.mean()]), [x], n_boot=3, rng=np.random.default_rng(7))
    idx = np.random.default_rng(7).integers(0, 5, (3, 5))
    assert got == (*_quantiles(x[idx].mean(axis=1)), "items")


def test_seeds_and_items_bootstrap_recomputed_draw_by_draw():
    """Two seeds, n_boot = 3: first the seeds drawn, (3, 2) from the stream; then, seed by seed, one resample of its
    items for every cell that drew it (in row-major order); a resample's statistic is the mean of its row."""
    x = [np.array([0.1, 0.7, 0.2]), np.array([0.5, 0.9, 0.3, 0.8, 0.6])]
    got = interval(np.array([v.mean() for v in x]), x, n_boot=3, rng=np.random.default_rng(3))
    rng = np.random.default_rng(3)
    drawn = rng.integers(0, 2, (3, 2))
    means = np.empty((3, 2))
    for j, v in enumerate(x):
        where = np.nonzero(drawn == j)
        if len(where[0]):
            means[where] = v[rng.integers(0, len(v), (len(where[0]), len(v)))].mean(axis=1)
    assert got == (*_quantiles(means.mean(axis=1)), "seeds+items")


def test_the_default_stream_is_seed_0_and_other_streams_differ():
    x = np.linspace(0, 1, 9)
    default = interval(np.array([x.mean()]), [x])
    assert default == interval(np.array([x.mean()]), [x], rng=np.random.default_rng(0))
    assert default != interval(np.array([x.mean()]), [x], rng=np.random.default_rng(1))


def test_a_nan_seed_is_left_out_with_its_items_and_lists_are_accepted():
    """Seeds [0.2, NaN, 0.4, 0.6]: the t interval of the three defined ones; with items, the NaN seed's items go with
    it (the same interval as without that seed); plain lists work as arrays do."""
    assert interval([0.2, np.nan, 0.4, 0.6], None) == interval(np.array([0.2, 0.4, 0.6]), None)
    lo, hi, kind = interval([0.2, np.nan, 0.4, 0.6], None)
    assert kind == "seeds" and (lo, hi) == (pytest.approx(0.4 - 4.302653 * 0.2 / np.sqrt(3), abs=1e-6),
                                            pytest.approx(0.4 + 4.302653 * 0.2 / np.sqrt(3), abs=1e-6))
    items = [[0.1, 0.3], [5.0, 7.0], [0.5, 0.3, 0.4]]
    assert interval([0.2, np.nan, 0.4], items, n_boot=50, rng=np.random.default_rng(1)) == \
        interval([0.2, 0.4], [items[0], items[2]], n_boot=50, rng=np.random.default_rng(1))
    assert interval([np.nan, np.nan], None)[2] == "none" and np.isnan(interval([np.nan], None)[0])


def _records(rows: list[dict]) -> pd.DataFrame:
    base = {"study": "s", "dataset": "d", "model": "m", "method": "a", "setting": "{}", "slice": "{}", "seed": 0,
            "config_id": "c", "metric": "reliability"}
    return R.finish(pd.DataFrame([{**base, **r} for r in rows]))


def test_each_cell_resamples_its_own_items():
    """Two methods, items all 1 and all 0: each cell's interval is its own items' ([1, 1] and [0, 0]) — per-item
    values join their record by every key field, none of them collapsed."""
    recs = _records([{"method": m, "value": v, "seed": s} for m, v in (("a", 1.0), ("b", 0.0)) for s in (0, 1)])
    items = pd.concat([R.item_rows(recs[(recs["method"] == m) & (recs["seed"] == s)], {"reliability": [v] * 3},
                                   ["i", "j", "k"]) for m, v in (("a", 1.0), ("b", 0.0)) for s in (0, 1)])
    board = leaderboard(recs, items).set_index("method")
    assert (board.loc["a", "ci_low"], board.loc["a", "ci_high"]) == (1.0, 1.0)
    assert (board.loc["b", "ci_low"], board.loc["b", "ci_high"]) == (0.0, 0.0)
    assert board.loc["a", "ci"] == CI_TEXT["seeds+items"] + " (2000 resamples, 95% percentile)"
    assert leaderboard(recs, items).equals(leaderboard(recs, items, seed=0))  # the default seed is 0


def test_a_cell_without_items_counts_none_and_the_default_seed_is_0():
    recs = _records([{"value": v, "seed": s} for s, v in enumerate((0.1, 0.5, 0.3))])
    row = leaderboard(recs).iloc[0]
    assert row["items"] == 0 and row["seeds"] == 3


def test_the_wide_table_cells_seeds_and_variants():
    """Cells read ``mean [low, high]`` from their own columns; the ``seeds`` column is the most seeds of any metric of
    the row, per row in the table's order (b before a: higher is better); one variant shared by every row is not
    shown, several are, each cut to 89 characters + "…"."""
    recs = _records([{"method": "a", "value": v, "seed": s} for s, v in enumerate((0.1, 0.2, 0.6))]
                    + [{"method": "b", "value": v, "seed": s} for s, v in enumerate((0.8, 0.9))]
                    + [{"method": "b", "metric": "oracle_completeness", "value": 0.5, "seed": s} for s in range(4)])
    board = leaderboard(recs, variants={"c": "x=1"})
    (t,) = wide(board).values()
    assert list(t["method"]) == ["b", "a"] and list(t["seeds"]) == [4, 3] and "variant" not in t
    a = board[(board["method"] == "a") & (board["metric"] == "reliability")].iloc[0]
    assert t.loc[t["method"] == "a", "reliability ↑"].item() == f"0.300 [{number(a['ci_low'], 0.3)}, " \
                                                                f"{number(a['ci_high'], 0.3)}]"
    assert a["ci_low"] < 0.3 < a["ci_high"]
    long = "y=" + "9" * 120
    recs2 = pd.concat([recs, _records([{"method": "c", "value": 0.4, "config_id": "c2"}])])
    (t2,) = wide(leaderboard(recs2, variants={"c": "x=1", "c2": long})).values()
    assert dict(zip(t2["method"], t2["variant"])) == {"a": "x=1", "b": "x=1", "c": long[:89] + "…"}


def test_setting_and_slice_are_shown_as_keys_and_values_and_a_blank_method_still_makes_a_row():
    recs = _records([{"value": 0.5, "setting": '{"alpha":1.0}'}, {"value": 0.7, "method": "", "model": "", "study": "t"}])
    tables = wide(leaderboard(recs))
    assert tables["s · d"]["setting"].tolist() == ["alpha=1.0"]
    assert tables["t · d"]["method"].tolist() == [""]


def test_markdown_tables_have_no_index_column_and_say_nothing_is_missing():
    recs = _records([{"value": 0.5}])
    md = markdown(leaderboard(recs))
    header = md.split("## s · d\n\n", 1)[1].splitlines()[0]
    assert header.startswith("| model") and "No headline metric recorded." not in md
    assert "No headline metric recorded." in markdown(leaderboard(recs.iloc[:0]))


@pytest.mark.parametrize(("x", "like", "text"), [
    (0.0, None, "0"), (0.0, 5.0, "0.000"), (0.0, 1.0, "0.000"), (0.5, 0.0, "0.5"), (1.0, 0.0, "1"),
    (100.0, None, "100.0"), (150.26, None, "150.3"), (99.9994, None, "99.999"), (0.01, None, "0.010"),
    (0.00999, None, "0.00999"), (0.0123456, 0.005, "0.0123")])
def test_number_formats_hand_written(x, like, text):
    assert number(x, like) == text


def test_a_cell_without_an_interval_is_its_mean_alone():
    assert cell_text(0.5, np.nan, np.nan) == "0.500" and cell_text(0.5, None, None) == "0.500"
