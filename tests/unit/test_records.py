"""The record schema: a study's table to records and back exactly, canonical JSON, config ids, per-item values, the
metrics registry and the checks that every recorded metric is registered and in range."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pandas as pd
import pytest

from cprobe import records as R
from cprobe.metrics.registry import HIGHER, LOWER, METRICS, NEITHER, unregistered
from cprobe.tasks import TASK_MODULES, task_module

WIDE = R.RecordSpec(
    dataset="dataset", model="model", layer="layer", read_layer=R.Derived(lambda t: t["layer"]), method="method",
    family="kind", setting=R.Derived(lambda t: [{"eps": e} for e in t["eps"]]),
    metrics={"completeness": "oracle_completeness", "reliability": "reliability"},
    patterns={r"oracle_acc_(.+)": ("oracle_accuracy", "property")}, n={"*": "n_test"})

LONG = R.RecordSpec(
    dataset=R.const("cebab"), model="model", method="explainer", slice=("aspect", "direction"),
    slice_defaults={"aspect": "all", "direction": "all"}, metric="metric", value="value", n="n")


def wide_table() -> pd.DataFrame:
    return pd.DataFrame({"model": ["m", "m"], "dataset": ["d", "d"], "layer": [2, 3], "method": ["pgd", "pgd"],
                         "kind": ["counterfactual"] * 2, "eps": [0.1, 0.2], "completeness": [0.5, np.nan],
                         "reliability": [0.25, 0.75], "oracle_acc_z_c": [0.9, 0.8], "oracle_acc_z_e": [0.6, 0.7],
                         "informative": [True, False], "n_test": [40, 40], "note": ["a", ""], "task": ["t", "t"],
                         "seed": [3, 3]})


def long_table() -> pd.DataFrame:
    return pd.DataFrame({"model": ["m"] * 3, "explainer": ["tcav", "tcav", ""], "aspect": ["all", "food", "food"],
                         "direction": ["all", "all", "Neg→Pos"], "metric": ["icace_error_l2", "icace_error_l2", "ate"],
                         "value": [0.3, 0.4, -1.0], "n": [10, 4, 2], "task": ["t"] * 3, "seed": [0] * 3})


def test_a_wide_table_becomes_one_record_per_metric_in_row_order():
    recs = R.to_records(wide_table(), WIDE, "t", 3, "cfg")
    assert tuple(recs.columns) == R.COLUMNS
    assert list(recs["metric"]) == ["oracle_completeness", "reliability", "oracle_accuracy", "oracle_accuracy"] * 2
    first = recs.iloc[:4]
    assert list(first["slice"]) == ["{}", "{}", '{"property":"z_c"}', '{"property":"z_e"}']
    assert list(first["value"]) == [0.5, 0.25, 0.9, 0.6]
    assert set(recs["family"]) == {"counterfactual"} and set(recs["setting"]) == {'{"eps":0.1}', '{"eps":0.2}'}
    assert recs["layer"].tolist() == recs["read_layer"].tolist() == [2] * 4 + [3] * 4
    assert recs["n"].tolist() == [40] * 8 and recs["seed"].tolist() == [3] * 8 and set(recs["config_id"]) == {"cfg"}
    assert np.isnan(recs["value"].iloc[4])  # NaN kept: the row is rebuilt exactly
    # what the schema does not name stays in info, in the table's column order (Derived sources included)
    assert json.loads(recs["info"].iloc[0]) == {"eps": 0.1, "informative": True, "n_test": 40, "note": "a"}
    assert str(recs["layer"].dtype) == "Int64" and recs["value"].dtype == "float64"


def test_a_metric_recorded_where_defined_has_no_record_on_the_rows_without_it():
    """An SAE's quality exists on the SAE methods' rows only: no NaN record elsewhere; an ordinary metric keeps its NaN
    (above), and the table still comes back with the column NaN where it was."""
    spec = R.RecordSpec(**{**WIDE.__dict__, "metrics": {**WIDE.metrics, "sae_fvu": "sae_fvu"},
                           "n": {"*": "n_test", "sae_fvu": "sae_n"}, "where_defined": ("sae_fvu",)})
    t = wide_table().assign(sae_fvu=[np.nan, 0.25], sae_n=[np.nan, 12])
    recs = R.to_records(t, spec, "t", 3, "cfg")
    fvu = recs[recs["metric"] == "sae_fvu"]
    assert fvu["layer"].tolist() == [3] and fvu["value"].tolist() == [0.25] and fvu["n"].tolist() == [12]
    assert recs["metric"].value_counts()["oracle_completeness"] == 2  # its NaN on row 2 is still a record
    back = R.from_records(recs, spec)
    assert back["sae_fvu"].isna().tolist() == [True, False] and back["sae_fvu"].iloc[1] == 0.25


@pytest.mark.parametrize("table, spec", [(wide_table, WIDE), (long_table, LONG)])
def test_records_rebuild_the_table_exactly(table, spec):
    t = table()
    back = R.from_records(R.to_records(t, spec, "t", int(t["seed"].iloc[0]), "cfg"), spec)
    pd.testing.assert_frame_equal(back[t.columns], t)


def test_slice_defaults_mean_the_whole_and_come_back():
    recs = R.to_records(long_table(), LONG, "t", 0, "c")
    assert list(recs["slice"]) == ["{}", '{"aspect":"food"}', '{"aspect":"food","direction":"Neg→Pos"}']
    assert list(recs["method"]) == ["tcav", "tcav", ""] and list(recs["dataset"]) == ["cebab"] * 3


def test_derived_records_are_written_but_never_read_back():
    spec = R.RecordSpec(model="model", metrics={"reliability": "reliability"},
                        extra=lambda t: pd.DataFrame({"model": ["m"], "metric": ["reliability"],
                                                      "value": [t["reliability"].mean()]}))
    t = pd.DataFrame({"model": ["m", "m"], "layer": [1, 2], "reliability": [0.2, 0.4]})
    recs = R.to_records(t, spec, "s", 0, "c")
    assert len(recs) == 3 and recs["info"].iloc[2] == "" and recs["value"].iloc[2] == pytest.approx(0.3)
    back = R.from_records(recs, spec)
    assert len(back) == 2 and back["reliability"].tolist() == [0.2, 0.4]


def test_canonical_json_sorts_keys_and_writes_nan_as_null():
    assert R.canonical({"b": np.float64(0.5), "a": np.int64(2)}) == '{"a":2,"b":0.5}'
    assert R.canonical({"x": float("nan"), "y": np.bool_(True)}) == '{"x":null,"y":true}'
    assert R.parse_cell("") == {} and R.parse_cell('{"a":1}') == {"a": 1}


def test_config_id_ignores_the_seed_and_run_only_keys():
    a = {"task": "probing", "seed": 0, "progress": True, "paths": {"output_root": "/a"}, "model": {"name": "m"}}
    b = {**a, "seed": 7, "progress": False, "force": True, "paths": {"output_root": "/b"}}
    assert R.config_id(a) == R.config_id(b)
    assert R.config_id(a) != R.config_id({**a, "model": {"name": "other"}})
    assert len(R.config_id(a)) == 12


def test_records_files_are_byte_identical_for_the_same_table(tmp_path):
    recs = R.to_records(wide_table(), WIDE, "t", 3, "cfg")
    for d in ("a", "b"):
        R.write_records(R.to_records(wide_table(), WIDE, "t", 3, "cfg"), tmp_path / d)
    assert (tmp_path / "a" / R.RECORDS_FILE).read_bytes() == (tmp_path / "b" / R.RECORDS_FILE).read_bytes()
    pd.testing.assert_frame_equal(R.read_records(tmp_path / "a" / R.RECORDS_FILE), recs)
    assert not (tmp_path / "a" / R.ITEMS_FILE).exists()


def test_item_helpers_key_items_to_their_record():
    recs = R.to_records(long_table(), LONG, "t", 0, "c")
    whole = recs[recs["slice"] == "{}"]
    items = R.item_rows(whole, {"icace_error_l2": [0.1, 0.5]}, ["p1", "p2"])
    assert list(items["item"]) == ["p1", "p2"] and list(items["value"]) == [0.1, 0.5]
    key = items[list(R.KEY)].drop_duplicates().reset_index(drop=True)
    assert key.equals(whole[list(R.KEY)].reset_index(drop=True))
    # the whole's items from breakdown records: aspect "food" is an item of the "all" record
    parts = R.breakdown_items(recs, ["icace_error_l2"], "aspect")
    assert list(parts["item"]) == ["food"] and list(parts["value"]) == [0.4] and list(parts["slice"]) == ["{}"]


def test_problems_name_unregistered_metrics_and_values_out_of_range():
    recs = R.to_records(wide_table(), WIDE, "t", 3, "cfg")
    assert R.problems(recs) == []
    bad = recs.copy()
    bad.loc[0, "value"] = 1.5  # completeness lies in [0, 1]
    bad.loc[1, "metric"] = "completenes"
    found = R.problems(bad)
    assert any("unregistered metric(s) ['completenes']" in p for p in found)
    assert any(p.startswith("oracle_completeness: 1 value(s) outside [0, 1]") for p in found)


# ----------------------------------------------------------------------------------------------- the registry
def test_every_metric_is_documented_with_a_direction_range_and_reference():
    for name, m in METRICS.items():
        assert m.name == name and m.title and len(m.definition) > 20 and m.reference, name
        assert m.direction in (HIGHER, LOWER, NEITHER), name
        lo, hi = m.range
        assert lo is None or hi is None or lo < hi, name
        assert m.studies and set(m.studies) <= set(TASK_MODULES.names()), name
    assert METRICS["reliability"].direction == HIGHER and METRICS["icace_error_l2"].direction == LOWER
    assert unregistered(["reliability", "nope"]) == ["nope"]


def test_colliding_table_names_map_to_distinct_metrics():
    """`completeness` and `selectivity` meant three and two things across the studies' tables; the records say
    which (CausalGym's per-site oracle completeness is Canby's eq. 1 at a site: the same metric)."""
    rel = task_module("reliability").RECORDS.metrics
    gym = task_module("causalgym").RECORDS.metrics
    assert rel["completeness"] == gym["completeness"] == "oracle_completeness"
    assert rel["selectivity"] == "oracle_selectivity" and "selectivity" not in gym
    assert "control_selectivity" in {m for m in task_module("causalgym")._OVERALL.values()}
    cebab = task_module("cebab")
    t = pd.DataFrame({"kind": ["explainer", "icace_error"], "metric": ["completeness", "icace_error"],
                      "distance": ["", "cosine"], "explainer": ["conceptshap", "tcav"]})
    assert cebab._metric(t) == ["conceptshap_completeness", "icace_error_cosine"]


def test_every_study_declares_its_records_with_registered_metrics():
    for name in TASK_MODULES.names():
        spec = task_module(name).RECORDS
        assert isinstance(spec, R.RecordSpec), name
        assert unregistered(spec.metrics.values()) == [], name
        assert unregistered(m for m, _ in spec.patterns.values()) == [], name


def test_metric_names_of_long_tables_are_registered():
    """Every (kind, metric) a long-table study writes maps to a registered metric."""
    cebab, liberty, pb = (importlib.import_module(f"cprobe.tasks.{s}") for s in ("cebab", "liberty", "prompt_bias"))
    ceb = pd.DataFrame([("classifier", m, "", "explained") for m in ("macro_f1", "accuracy")]
                       + [(k, k, "", "") for k in ("pairs", "ate", "cace", "acace")]
                       + [("icace_error", "icace_error", d, "tcav") for d in ("l2", "cosine", "normdiff")]
                       + [("explainer", m, "", "x") for m in ("completeness", "fallback_nearest", "fallback_none",
                                                               "concept_probe_before", "concept_probe_after")],
                       columns=["kind", "metric", "distance", "explainer"])
    assert unregistered(cebab._metric(ceb)) == []
    lib = pd.DataFrame([("classifier", m, "", "explained") for m in ("macro_f1", "accuracy")]
                       + [("ed", "ed", d, "x") for d in ("l2", "cosine", "normdiff", "mean")]
                       + [(k, k, "", "x") for k in ("of", "global_of", "importance")]
                       + [("sensitivity", "", "", e) for e in ("model", "scm")]
                       + [("explainer", "fallback_none", "", "x")], columns=["kind", "metric", "distance", "explainer"])
    assert unregistered(liberty._metric(lib)) == []
    names = liberty._metric(lib)
    assert names[2:6] == ["ed_l2", "ed_cosine", "ed_normdiff", "ed"] and names[9:11] == ["sensitivity", "true_effect"]
    rows = ([("p1", ""), ("stability", ""), ("rank_instability", "rank_instability"), ("rank_consistency", ""),
             ("disparity", "")] + [("spread", m) for m in ("original", "worst", "best", "std", "diff")]
            + [("summary", m) for m in ("lama_p1", "worst_p1", "best_p1", "std", "diff", "diff_gt10_share",
                                        "verbalization_stability", "p1_backdoor", "true_knowledge", "mean_exposure")])
    names = pb._metric(pd.DataFrame(rows, columns=["kind", "metric"]))
    assert unregistered(names) == []
    assert names[5] == names[10] == "lama_p1"  # a relation's original-prompt P@1 and its mean over relations
