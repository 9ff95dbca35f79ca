"""CEBaB items, labels and edit pairs on small files the tests write; the effect metrics by hand."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cprobe.data.cebab import (
    CebabKeys,
    direction_name,
    edit_pairs,
    encode_rating,
    labelled,
    load_cebab,
    pair_frame,
    read_split,
)
from cprobe.data.registry import load_dataset
from cprobe.errors import ConfigError, DataError
from cprobe.metrics.icace import acace, cace, ite
from tests.cebab_fixtures import record, unit, write_cebab


def test_rating_encodings():
    assert [encode_rating(r, "5way") for r in "12345"] == [0, 1, 2, 3, 4]
    assert [encode_rating(r, "3way") for r in "12345"] == [0, 0, 1, 2, 2]
    assert [encode_rating(r, "2way") for r in "12345"] == [0, 0, None, 1, 1]  # 3★ dropped
    assert encode_rating("no majority", "5way") is None and encode_rating(None, "2way") is None
    with pytest.raises(ConfigError, match="unknown CEBaB task '4way'"):
        encode_rating("3", "4way")


def test_pairs_follow_the_public_rule(tmp_path):
    recs = unit(1, {"food": "Positive", "service": "Negative"}, [("food", "Negative"), ("food", "unknown"),
                                                               ("service", "Positive")])
    recs.append(record(1, 9, {"food": "Positive", "service": "Negative"}, "food", "Negative"))  # edit failed
    recs.append(record(1, 8, {"food": "no majority", "service": "Negative"}, "food", "unknown"))
    p = tmp_path / "dev.json"
    p.write_text(json.dumps(recs))
    pairs = edit_pairs(read_split(p))
    got = sorted((pr.base.id[-1], pr.source.id[-1], *next(iter(pr.changes.values()))) for pr in pairs)
    # orig↔food-Neg, orig↔food-unk, orig↔service-Pos (both ways), food-Neg↔food-unk and food-unk↔failed edit
    # (edit↔edit of the same type); the failed edit keeps food Positive (= original) and no-majority never pairs
    assert got == sorted([
        ("0", "1", "Positive", "Negative"), ("1", "0", "Negative", "Positive"),
        ("0", "2", "Positive", "unknown"), ("2", "0", "unknown", "Positive"),
        ("0", "3", "Negative", "Positive"), ("3", "0", "Positive", "Negative"),
        ("1", "2", "Negative", "unknown"), ("2", "1", "unknown", "Negative"),
        ("2", "9", "unknown", "Positive"), ("9", "2", "Positive", "unknown"),
        ("1", "9", "Negative", "Positive"), ("9", "1", "Positive", "Negative"),
    ])
    pf = pair_frame(pairs)
    row = pf[pf["pair"] == "000001_000000>000001_000001"].iloc[0]
    assert (row["aspect"], row["direction"], row["sign"]) == ("food", "Neg→Pos", -1)  # Pos→Neg is Neg→Pos reversed
    assert direction_name("Positive", "unknown") == "Pos→Unk"


def test_loader_splits_and_labels(tmp_path):
    write_cebab(tmp_path, n_train=8, n_eval=4)
    data = load_dataset({"name": "cebab", "type": "cebab", "path": "cebab", "train": "inclusive"}, tmp_path)
    assert set(data.splits) == {"train", "dev", "test"} and len(data.splits["dev"]) == 4 * 3
    items, y = labelled(data.splits["train"], "2way")
    assert all(encode_rating(it.outcome, "2way") == c for it, c in zip(items, y))
    assert all(it.outcome != "3" for it in items)
    assert data.source == "cebab"  # relative to the data dir


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="CEBaB file .* not found"):
        load_cebab(CebabKeys(path=str(tmp_path / "nowhere")), tmp_path)
    with pytest.raises(ConfigError, match="unknown CEBaB train variant"):
        load_cebab(CebabKeys(train="all"), tmp_path)  # type: ignore[arg-type]
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(DataError, match="cannot read"):
        read_split(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps([{"id": "1"}]))
    with pytest.raises(DataError, match="lacks field"):
        read_split(tmp_path / "y.json")
    with pytest.raises(ConfigError, match="unknown key"):
        load_dataset({"name": "cebab", "type": "cebab", "split": "x"}, tmp_path)


@pytest.mark.parametrize("field, value, message", [
    ("description", None, "description is None; expected the review's text"),
    ("description", "  ", "description is '  '"),
    ("review_majority", float("nan"), "review_majority is nan; expected one of ['1', '2', '3', '4', '5', 'no majority']"),
    ("review_majority", None, "review_majority is None"),
    ("review_majority", "6", "review_majority is '6'"),
    ("food_aspect_majority", float("nan"), "food_aspect_majority is nan; expected one of"),
    ("service_aspect_majority", "Neutral", "service_aspect_majority is 'Neutral'"),
    ("is_original", "yes", "is_original is 'yes'"),
])
def test_a_malformed_record_is_a_one_line_error_naming_file_record_and_line(field, value, message, tmp_path):
    """A null description once became the text "None" and a NaN rating a silently dropped row."""
    recs = unit(1, {"food": "Positive"}, [("food", "Negative")]) + unit(2, {"food": "Negative"}, [("food", "unknown")])
    recs[2][field] = value
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(recs, indent=1))  # NaN is written as JSON's NaN, which Python's reader accepts
    with pytest.raises(DataError) as e:
        read_split(path)
    msg = str(e.value)
    assert message in msg and f"{path}, record 2 (line " in msg and "id '000002_000000'" in msg and "\n" not in msg
    line = int(msg.split("(line ")[1].split(")")[0])
    assert path.read_text().splitlines()[line - 1].strip() == "{"  # the line the record starts on
    recs[2][field] = {"description": "fine text", "review_majority": 4, "food_aspect_majority": None,
                      "service_aspect_majority": "", "is_original": True}[field]
    path.write_text(json.dumps(recs))
    items = read_split(path)  # an integer rating, a null aspect label: accepted
    assert items[2].outcome in ("4", "1", "2", "3", "5") and items[2].concepts["food"] in ("", "Negative", "unknown")


def test_max_examples_is_a_key_of_the_cebab_dataset_as_the_docs_write_it(tmp_path):
    """docs/cebab.md: `dataset.max_examples=N` (no `+`) subsamples the training split."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.conftest import REPO

    for experiment in ("cebab", "liberty_cv"):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = OmegaConf.to_container(compose("config", overrides=[f"+experiment={experiment}",
                                                                     "dataset.max_examples=50"]))
        assert cfg["dataset"]["max_examples"] == 50
    assert "`dataset.max_examples=N`" in (REPO / "docs" / "cebab.md").read_text()
    write_cebab(tmp_path, n_train=40, n_eval=4)
    data = load_dataset({"name": "cebab", "type": "cebab", "path": "cebab", "max_examples": 50}, tmp_path)
    assert len(data.splits["train"]) == 50 and len(data.splits["dev"]) == 4 * 3


def test_effect_metrics_by_hand():
    np.testing.assert_allclose(cace([[0.1, -0.1], [0.3, -0.3]]), [0.2, -0.2])
    assert cace([1.0, 2.0, 0.0]) == pytest.approx(1.0)
    assert acace([1.0, -0.5, 0.0]) == pytest.approx(0.5)  # mean |CaCE| over {c, c′} pairs
    assert acace([[3.0, 4.0], [0.0, 0.0]]) == pytest.approx(2.5)  # vector CaCEs: L2 norms
    np.testing.assert_allclose(ite([1, 5, 3], [2, 3, 3]), [1, -2, 0])
    with pytest.raises(ValueError):
        cace([])


def _frame():
    # two food pairs Neg→Pos (one stored reversed), one service Pos→Unk
    return pd.DataFrame({
        "pair": ["a", "b", "c"], "aspect": ["food", "food", "service"], "c": ["Negative", "Positive", "Positive"],
        "c_prime": ["Positive", "Negative", "unknown"], "direction": ["Neg→Pos", "Neg→Pos", "Pos→Unk"],
        "sign": [1, -1, 1], "base_rating": ["2", "5", "4"], "cf_rating": ["4", "1", "no majority"],
        "original_id": ["1", "2", "3"]})


def test_ate_cace_and_error_rows_by_hand():
    from cprobe.tasks.cebab import _cace_rows, _data_effect_rows, _error_rows

    rows = {(r["kind"], r["aspect"], r["direction"]): r for r in _data_effect_rows({}, _frame(), "5way",
                                                                                     ["food", "service"])}
    # food Neg→Pos: +2 (2★→4★) and the reversed pair 5★→1★ counts as +4 → mean 3; the no-majority pair is left out
    assert rows[("ate", "food", "Neg→Pos")]["value"] == pytest.approx(3.0)
    assert rows[("ate", "food", "Neg→Pos")]["n"] == 2 and rows[("pairs", "food", "Neg→Pos")]["value"] == 2
    assert np.isnan(rows[("ate", "service", "Pos→Unk")]["value"]) and rows[("pairs", "service", "Pos→Unk")]["n"] == 1
    assert np.isnan(rows[("ate", "food", "Pos→Unk")]["value"])
    two = {(r["kind"], r["aspect"], r["direction"]): r for r in _data_effect_rows({}, _frame(), "2way", ["food"])}
    assert two[("ate", "food", "Neg→Pos")]["value"] == pytest.approx(1.0)  # 0→1 and reversed 1→0
    cace_rows = {(r["kind"], r["aspect"], r["direction"]): r["value"] for r in
                 _cace_rows({}, _frame(), np.array([1, 4, 3]), np.array([3, 1, 3]), ["food", "service"])}
    assert cace_rows[("cace", "food", "Neg→Pos")] == pytest.approx((2 + 3) / 2)  # argmax class: +2, reversed −3
    assert cace_rows[("acace", "food", "all")] == pytest.approx(2.5)  # only Neg→Pos has pairs
    assert cace_rows[("cace", "service", "Pos→Unk")] == 0.0
    err = {(r["aspect"], r["direction"]): (r["value"], r["n"])
           for r in _error_rows({}, "x", "l2", _frame(), np.array([1.0, 2.0, 4.0]))}
    assert err[("all", "all")] == (pytest.approx(7 / 3), 3) and err[("food", "all")] == (1.5, 2)
    assert err[("food", "Neg→Pos")] == (1.0, 1) and err[("food", "Pos→Neg")] == (2.0, 1)  # ordered directions


def test_report_layout_mean_std_over_seeds(tmp_path):
    from cprobe.tasks.cebab import error_table, report

    rows = []
    for seed, (a, b) in enumerate([(0.5, 0.9), (0.7, 1.1)]):
        for ex, v in (("random", b), ("approx", a)):
            rows.append({"kind": "icace_error", "model": "m", "cebab_task": "5way", "train_variant": "exclusive",
                         "eval_split": "test", "explainer": ex, "distance": "l2", "aspect": "all", "direction": "all",
                         "value": v, "n": 10, "seed": seed, "split": "", "metric": "icace_error"})
    t = pd.DataFrame(rows)
    tab = error_table(t)
    assert list(tab.columns[-2:]) == ["random", "approx"]
    assert tab["random"].iloc[0] == "1.00 (0.14)" and tab["approx"].iloc[0] == "0.60 (0.14)"
    report(t, tmp_path)
    assert (tmp_path / "cebab_icace_error.md").is_file() and list(tmp_path.glob("cebab_icace_error_m_5way.png"))


def test_task_pairs_and_queries_show_explainers_only_the_base(tmp_path):
    from cprobe.explainers import Observed
    from cprobe.tasks.cebab import task_pairs
    from cprobe.tasks.effects import pair_queries

    recs = unit(1, {"food": "Positive", "service": "Negative"}, [("food", "Negative"), ("service", "Positive")])
    recs[2]["review_majority"] = "3"  # the service edit is rated 3★: no class under 2-way
    p = tmp_path / "dev.json"
    p.write_text(json.dumps(recs))
    items = read_split(p)
    assert len(task_pairs(items, "5way", ["food", "service"])) == 4
    pairs = task_pairs(items, "2way", ["food", "service"])
    assert len(pairs) == 2 and all(pr.intervened == ("food",) for pr in pairs)
    assert len(task_pairs(items, "5way", ["service"])) == 2
    index = {it.id: i for i, it in enumerate(items)}
    everything = Observed(texts=[it.text for it in items], probs=np.eye(3)[[0, 1, 2]],
                          concepts=[dict(it.concepts) for it in items], predicted=[{"food": "x"}] * 3,
                          groups=["1"] * 3)
    q = pair_queries(pairs, everything, index)
    assert list(q.base.texts) == [pr.base.text for pr in pairs]
    np.testing.assert_allclose(q.base.probs, np.eye(3)[[index[pr.base.id] for pr in pairs]])
    assert q.base.concepts is None and q.base.predicted == [{"food": "x"}] * 2  # predicted, never gold
    assert list(zip(q.aspect, q.c, q.c_prime)) == [("food", *pr.changes["food"]) for pr in pairs]


def test_report_keeps_different_settings_apart(tmp_path):
    from cprobe.tasks.cebab import error_table

    rows = [{"kind": "icace_error", "model": "m", "cebab_task": "5way", "train_variant": "exclusive",
             "eval_split": "test", "explainer": "approx", "distance": "l2", "aspect": "all", "direction": "all",
             "value": v, "n": 10, "seed": 0, "config_id": cid} for cid, v in (("aaaa", 0.5), ("bbbb", 0.9))]
    tab = error_table(pd.DataFrame(rows))
    assert list(tab["config_id"]) == ["aaaa", "bbbb"] and list(tab["approx"]) == ["0.50 (0.00)", "0.90 (0.00)"]


def test_max_scored_texts_caps_the_tables_dev_and_test_texts_but_never_the_pairs(tmp_path):
    from cprobe.tasks.cebab import Config, scored, study

    write_cebab(tmp_path, n_train=8, n_eval=6)
    data = load_dataset({"name": "cebab", "type": "cebab", "path": "cebab", "train": "inclusive"}, tmp_path)
    every = study(data, Config())
    train, _ = labelled(data.splits["train"], "5way")
    assert [it.id for it in every.texts] == list(dict.fromkeys(
        it.id for it in (*train, *data.splits["dev"], *data.splits["test"])))  # null: all, in the order they were
    capped = Config(max_scored_texts=5)
    few = study(data, capped)
    kept = {it.id for it in few.texts}
    dev, test = scored(data, "dev", capped), scored(data, "test", capped)
    assert len(dev) == len(test) == 5 and len(data.splits["test"]) > 5
    assert {it.id for it in dev} <= kept and {it.id for it in test} <= kept
    assert [it.id for it in dev] == [it.id for it in data.splits["dev"] if it.id in {d.id for d in dev}]  # order kept
    assert all(p.base.id in kept and p.source.id in kept for p in few.pairs)
    assert [p.id for p in few.pairs] == [p.id for p in every.pairs]
    assert len(few.texts) < len(every.texts)
    assert scored(data, "dev", capped) == dev  # drawn once: the same texts every call
