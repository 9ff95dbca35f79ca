"""The record schema's survivors of the mutation pass (issue 30, scripts/mutation.py), each pinned by a value: JSON of
missing values and lists, config ids independent of key order, columns a spec names but a table lacks, string and
float identity columns, integer columns with gaps, round trips of settings, slices, all-NaN metrics, unsorted rows,
missing booleans, patterns with a suffix; the items and job-level helpers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cprobe import records as R

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)


def test_missing_values_and_lists_in_json():
    assert R.canonical({"b": None, "a": pd.NA, "c": float("nan")}) == '{"a":null,"b":null,"c":null}'
    assert R.canonical({"a": [1, np.int64(2), (3.5,)]}) == '{"a":[1,2,[3.5]]}'


def test_a_config_id_does_not_depend_on_key_order():
    assert R.config_id({"a": 1, "b": {"x": 1, "y": 2}}) == R.config_id({"b": {"y": 2, "x": 1}, "a": 1})


def test_finish_fills_what_a_frame_lacks_and_types_what_it_has():
    """Missing setting / slice are ``{}``; identity columns holding floats become their text, NaN ""; an integer
    column of floats is cut to ints the safe way, gaps NA."""
    f = R.finish(pd.DataFrame({"metric": ["reliability"] * 2, "value": [1.0, 2.0], "model": [1.5, None],
                               "layer": [1.5, None], "family": ["direction", "x"]}))
    assert f["setting"].tolist() == ["{}", "{}"] and f["slice"].tolist() == ["{}", "{}"]
    assert f["model"].tolist() == ["1.5", ""]
    assert f["layer"].tolist()[0] == 1 and f["layer"].isna().tolist() == [False, True]


def test_a_field_named_but_absent_is_empty_and_a_string_n_is_read_for_every_metric():
    spec = R.RecordSpec(model="model", layer="layer", metrics={"reliability": "reliability"}, n="n_test")
    recs = R.to_records(pd.DataFrame({"model": ["m"], "reliability": [0.5], "n_test": [7]}), spec, "s", 0, "c")
    assert recs["layer"].isna().all() and recs["n"].tolist() == [7]
    empty = R.RecordSpec(model="model", metrics={"oracle_completeness": "oracle_completeness"})
    assert len(R.to_records(pd.DataFrame({"model": ["m", "m"], "other": [1, 2]}), empty, "s", 0, "c")) == 0


def test_a_long_tables_value_and_n_columns_become_the_records():
    spec = R.RecordSpec(model="model", method="explainer", metric="metric", value="value", n="n")
    t = pd.DataFrame({"model": ["m"], "explainer": ["tcav"], "metric": ["icace_error_l2"], "value": [0.3], "n": [4],
                      "note": ["x"]})
    recs = R.to_records(t, spec, "s", 0, "c")
    assert recs["n"].tolist() == [4] and recs["value"].tolist() == [0.3]
    assert json.loads(recs["info"].iloc[0]) == {"note": "x"}  # value and n are fields, not info


SPEC = R.RecordSpec(model="model", layer="layer", method="method", setting=("eps",), slice=("prop",),
                    metrics={"reliability": "reliability", "oracle_completeness": "oracle_completeness"},
                    patterns={r"(.+)_acc": ("oracle_accuracy", "property")}, n={"*": "n"})


def _table() -> pd.DataFrame:
    """Rows out of key order, a layer with a gap, a metric NaN everywhere, a boolean with a gap, a mixed column."""
    return pd.DataFrame({"model": ["m", "m", "m"], "layer": [3.0, np.nan, 2.0], "method": ["b", "a", "a"],
                         "eps": [0.2, 0.1, 0.1], "prop": ["x", "y", "x"], "reliability": [0.5, 0.25, 0.75],
                         "oracle_completeness": [np.nan] * 3, "z_c_acc": [0.9, 0.8, 0.7], "n": [4, 5, 6],
                         "ok": [True, None, False], "mixed": [1, "a", None], "gone": [np.nan] * 3,
                         "task": ["t"] * 3, "seed": [0] * 3})


def test_settings_slices_gaps_and_all_nan_columns_come_back_exactly():
    t = _table()
    recs = R.to_records(t, SPEC, "t", 0, "cfg")
    assert set(recs.loc[recs["metric"] == "oracle_accuracy", "slice"]) == {'{"prop":"x","property":"z_c"}',
                                                                           '{"prop":"y","property":"z_c"}'}
    back = R.from_records(recs, SPEC)
    pd.testing.assert_frame_equal(back[t.columns], t, check_dtype=False)
    assert back["ok"].tolist() == [True, None, False] and back["mixed"].tolist() == [1, "a", None]


def test_a_foreign_record_beside_a_studys_records_is_ignored():
    recs = R.to_records(_table(), SPEC, "t", 0, "cfg")
    foreign = recs.iloc[:1].assign(metric="task_accuracy", info="{}")
    back = R.from_records(pd.concat([recs, foreign], ignore_index=True), SPEC)
    pd.testing.assert_frame_equal(back[_table().columns], _table(), check_dtype=False)


def test_extra_records_may_be_none():
    spec = R.RecordSpec(model="model", metrics={"reliability": "reliability"}, extra=lambda t: None)
    assert len(R.to_records(pd.DataFrame({"model": ["m"], "reliability": [0.5]}), spec, "s", 0, "c")) == 1


def _recs(n: int = 2) -> pd.DataFrame:
    return R.finish(pd.DataFrame([{"study": "s", "model": "m", "method": f"x{i}", "metric": "reliability",
                                   "value": 0.5, "n": 9, "seed": 0} for i in range(n)]))


def test_items_are_written_beside_the_records_and_read_back(tmp_path):
    recs = _recs()
    items = R.item_rows(recs, {"reliability": [0.0, 1.0, np.nan]}, ["a", "b", "c"])
    R.write_records(recs, tmp_path, items)
    back = pd.read_parquet(tmp_path / R.ITEMS_FILE)
    assert back["value"].iloc[:2].tolist() == [0.0, 1.0] and np.isnan(back["value"].iloc[2])
    assert len(back) == 6 and back["item"].tolist() == ["a", "b", "c"] * 2


def test_counting_items_with_none_and_with_every_record_itemised():
    recs = _recs()
    assert R.count_items(recs, None) is recs
    items = R.item_rows(recs, {"reliability": [0.0, np.nan, 1.0]}, ["a", "b", "c"])
    assert R.count_items(recs, items)["n"].tolist() == [2, 2]


def test_breakdown_items_are_the_parts_of_each_whole():
    """CausalGym's overall odds per task are the items of the mean over tasks (slice without the key)."""
    rows = [{"metric": "overall_odds", "value": v, "slice": R.canonical({"cg_task": k})} for k, v in (("a", 1.0),
                                                                                                        ("b", 3.0))]
    recs = R.finish(pd.DataFrame([{"study": "causalgym", "model": "m", "seed": 0, **r}
                                  for r in [*rows, {"metric": "overall_odds", "value": 2.0, "slice": "{}"}]]))
    items = R.breakdown_items(recs, ["overall_odds"], "cg_task")
    assert items["slice"].tolist() == ["{}", "{}"] and sorted(items["item"]) == ["a", "b"]
    assert sorted(items["value"]) == [1.0, 3.0]


def test_job_level_records_read_the_first_row():
    t = pd.DataFrame({"model": ["m", "m"], "acc": [0.9, 0.9], "n_items": [10, 10], "other": [1, 2]})
    out = R.job_records(t, {"acc": "task_accuracy", "missing": "x"}, {"model": "model", "layer": "nope"}, n="n_items")
    assert out.to_dict("records") == [{"model": "m", "metric": "task_accuracy", "value": 0.9, "n": 10}]
    bare = R.job_records(t, {"acc": "task_accuracy"})
    assert bare.to_dict("records") == [{"metric": "task_accuracy", "value": 0.9, "n": None}]
    assert R.job_records(t.iloc[:0], {"acc": "task_accuracy"}).empty
