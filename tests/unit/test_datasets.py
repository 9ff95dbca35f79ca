"""Dataset loaders: exact labels, file:line errors, generic config-defined files."""

from __future__ import annotations

import json

import pytest

from cprobe.data.base import Dataset, Example
from cprobe.data.generic import load_generic
from cprobe.data.lgd import load_lgd, verb_number
from cprobe.data.marvin_linzen import load_marvin_linzen, parse_condition
from cprobe.data.registry import load_dataset, stratified_sample
from cprobe.errors import ConfigError, DataError
from tests.conftest import SHARED_DATA, needs_shared


@pytest.mark.parametrize("correct,wrong,expected", [
    ("is", "are", "sg"), ("are", "is", "pl"), ("has", "have", "sg"), ("contains", "contain", "sg"),
    ("contain", "contains", "pl"), ("goes", "go", "sg"), ("tries", "try", "sg"), ("try", "tries", "pl"),
    ("foo", "bar", None),
])
def test_verb_number(correct, wrong, expected):
    assert verb_number(correct, wrong) == expected


def test_parse_condition():
    assert parse_condition("sing_MS_MV_plur_ES") == ["sg", "pl"]
    assert parse_condition("plur_IS_IV") == ["pl"]
    assert parse_condition("sing_ES_EV_plur_MS_MV") == ["sg", "pl"]


def _write_ml(root, task, rows):
    (root / "by_task").mkdir(parents=True, exist_ok=True)
    (root / "by_task" / f"{task}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_marvin_linzen_labels(tmp_path):
    _write_ml(tmp_path, "prep_anim", [
        {"task": "prep_anim", "condition": "sing_MS_MV_plur_ES", "item": 0,
         "grammatical": "the author near the guards laughs", "ungrammatical": "the author near the guards laugh"}])
    _write_ml(tmp_path, "obj_rel_within_anim", [
        {"task": "obj_rel_within_anim", "condition": "plur_ES_EV_sing_MS_MV", "item": 0,
         "grammatical": "the author that the guards like laughs",
         "ungrammatical": "the author that the guards likes laughs"}])
    ds = load_marvin_linzen(tmp_path, ["prep_anim", "obj_rel_within_anim"])
    a, b = ds.examples
    assert (a.target, a.correct, a.wrong, a.props["z_c"], a.props["z_e"]) == (5, "laughs", "laugh", "sg", "pl")
    # inside the relative clause the closest noun before the verb is its own subject: z_e is none
    assert (b.target, b.correct, b.props["z_c"], b.props["z_e"]) == (5, "like", "pl", "none")


def test_marvin_linzen_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown Marvin"):
        load_marvin_linzen(tmp_path, ["reflexives_across"])
    with pytest.raises(DataError, match="not found"):
        load_marvin_linzen(tmp_path, ["prep_anim"])
    (tmp_path / "by_task").mkdir()
    (tmp_path / "by_task" / "prep_anim.jsonl").write_text('{"condition": "sing_MS_MV"}\n{bad json\n')
    with pytest.raises(DataError, match=r"prep_anim.jsonl:1"):
        load_marvin_linzen(tmp_path, ["prep_anim"])


def test_lgd_errors_name_file_and_line(tmp_path):
    f = tmp_path / "l.tsv"
    hdr = "id\tn_attractors\tverb_index\tcorrect_verb\twrong_verb\tsentence\tmasked_sentence\tprefix\n"
    f.write_text(hdr + "0\t0\t1\tis\tare\tit is here\tx\tit\n1\t0\t9\tis\tare\tit is here\tx\tit\n")
    with pytest.raises(DataError, match=r"l.tsv:3"):
        load_lgd(f)
    f.write_text(hdr + "0\t0\t1\tis\n")
    with pytest.raises(DataError, match=r"l.tsv:2: expected 8 columns"):
        load_lgd(f)


@needs_shared("lgd_agreement", "lgd_subset.tsv")
def test_lgd_real_file():
    ds = load_lgd(SHARED_DATA / "lgd_agreement" / "lgd_subset.tsv")
    assert 7400 <= len(ds) <= 7489
    e = ds.examples[0]
    assert e.words[e.target] == e.correct == "is" and e.props["z_c"] == "sg"
    assert set(ds.values("z_c")) == {"pl", "sg"} and ds.values("z_e") == []


@needs_shared("marvin_linzen", "by_task")
def test_marvin_linzen_real_files():
    ds = load_marvin_linzen(SHARED_DATA / "marvin_linzen", ["prep_inanim", "simple_agrmt"])
    assert len(ds) == 5040 + 140
    prep = [e for e in ds.examples if e.props["task"] == "prep_inanim"]
    assert {e.props["z_e"] for e in prep} == {"sg", "pl"}
    assert all(e.words[e.target - 1] in ("guard", "guards") or e.props["z_e"] != "none" for e in prep[:50])


def test_generic_tsv_with_mask_and_props(tmp_path):
    f = tmp_path / "mine.tsv"
    f.write_text("sentence\tgood\tbad\tsubj\n"
                 "the dog ***mask*** here\tis\tare\tsg\n"
                 "the dogs ***mask*** here\tare\tis\tpl\n")
    ds = load_generic(f, {"sentence": "sentence", "correct": "good", "wrong": "bad"}, {"z_c": "subj"})
    assert [e.sentence() for e in ds.examples] == ["the dog is here", "the dogs are here"]
    assert ds.values("z_c") == ["pl", "sg"] and list(ds.labels("z_c")) == [1, 0]


def test_generic_jsonl_target_column_and_errors(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"s": "the dog barks", "t": 2, "c": "barks", "w": "bark", "n": ""}) + "\n")
    cols = {"sentence": "s", "target": "t", "correct": "c", "wrong": "w"}
    ds = load_generic(f, cols, {"z_c": "n"})
    assert ds.examples[0].props["z_c"] == "none"
    with pytest.raises(ConfigError, match="must map"):
        load_generic(f, {"sentence": "s"}, {})
    with pytest.raises(DataError, match=r"mine.jsonl:1: missing column"):
        load_generic(f, {**cols, "correct": "nope"}, {})
    f.write_text(json.dumps({"s": "the dog barks", "t": 2, "c": "barks", "w": "bark"}) + "\n[1]\n")
    with pytest.raises(DataError, match=r"mine.jsonl:2"):
        load_generic(f, cols, {})


def test_empty_dataset_is_a_clear_error():
    with pytest.raises(DataError, match="empty"):
        Dataset("x", (), ("z_c",))


def test_stratified_sample_keeps_proportions():
    ex = tuple(Example(str(i), ("a", "b"), 1, "b", "c", {"z_c": "sg" if i % 4 else "pl"}) for i in range(400))
    ds = Dataset("x", ex, ("z_c",))
    idx = stratified_sample(ds, 100, "z_c", 0)
    assert len(idx) == len(set(idx)) == 100
    assert sum(ds.examples[i].props["z_c"] == "pl" for i in idx) == 25
    assert idx == stratified_sample(ds, 100, "z_c", 0)


def test_unknown_dataset_type(tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset type 'nope'; choose from"):
        load_dataset({"type": "nope"}, tmp_path)
