"""Dataset loaders: exact labels, file:line errors, generic config-defined files."""

from __future__ import annotations

import json

import pytest

from cprobe.data.base import Dataset, Example
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


def _generic(path, **kw):
    return load_dataset({"name": "mine", "type": "generic", "path": str(path), **kw}, path.parent)


COLS = {"sentence": "sentence", "correct": "good", "wrong": "bad"}


def test_generic_tsv_with_mask_and_props(tmp_path):
    f = tmp_path / "mine.tsv"
    f.write_text("sentence\tgood\tbad\tsubj\n"
                 "the dog ***mask*** here\tis\tare\tsg\n"
                 "the dogs ***mask*** here\tare\tis\tpl\n")
    ds = _generic(f, columns=COLS, properties={"z_c": "subj"})
    assert [e.sentence() for e in ds.examples] == ["the dog is here", "the dogs are here"]
    assert ds.values("z_c") == ["pl", "sg"] and list(ds.labels("z_c")) == [1, 0]
    assert ds.source == "mine.tsv"  # recorded relative to the data dir


def test_generic_jsonl_target_column_and_errors(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"s": "the dog barks", "t": 2, "c": "barks", "w": "bark", "n": ""}) + "\n")
    cols = {"sentence": "s", "target": "t", "correct": "c", "wrong": "w"}
    ds = _generic(f, columns=cols, properties={"z_c": "n"})
    assert ds.examples[0].props["z_c"] == "none"
    with pytest.raises(ConfigError, match="must map"):
        _generic(f, columns={"sentence": "s"})
    with pytest.raises(DataError, match=r"mine.jsonl:1: missing column"):
        _generic(f, columns={**cols, "correct": "nope"})
    f.write_text(json.dumps({"s": "the dog barks", "t": 2, "c": "barks", "w": "bark"}) + "\n[1]\n")
    with pytest.raises(DataError, match=r"mine.jsonl:2"):
        _generic(f, columns=cols)


def test_generic_paired_rows_layout(tmp_path):
    """A grammatical and an ungrammatical row per item, paired by a key; the slot is the differing word."""
    f = tmp_path / "pairs.csv"
    f.write_text("pair,ok,text,num\n"
                 "p1,1,the keys to the cabinet are here,pl\n"
                 "p1,0,the keys to the cabinet is here,pl\n"
                 "p2,0,the key to the cabinets are here,sg\n"
                 "p2,1,the key to the cabinets is here,sg\n")
    ds = _generic(f, columns={"sentence": "text"}, pair_by="pair", label="ok", properties={"z_c": "num"})
    ex = {e.id: e for e in ds.examples}
    assert (ex["mine-p1"].target, ex["mine-p1"].correct, ex["mine-p1"].wrong) == (5, "are", "is")
    assert (ex["mine-p2"].correct, ex["mine-p2"].wrong, ex["mine-p2"].props["z_c"]) == ("is", "are", "sg")
    f.write_text("pair,ok,text\np1,1,the keys are here\np2,0,the key are here\n")
    with pytest.raises(DataError, match=r"pairs.csv:2: pair='p1' has no wrong row"):
        _generic(f, columns={"sentence": "text"}, pair_by="pair", label="ok")
    f.write_text("pair,ok,text\np1,yes,the keys are here\n")
    with pytest.raises(DataError, match="neither of dataset.label_values"):
        _generic(f, columns={"sentence": "text"}, pair_by="pair", label="ok")


def test_generic_tab_extension_quoting_and_end_markers(tmp_path):
    """A .tab file written by pandas' defaults (quoted fields with quotes and tabs) loses no sentence, and
    tokenised text with <eos> end markers is stripped."""
    pd = pytest.importorskip("pandas")
    rows = [{"sentence": f'he said " the {n} ***mask*** here " <eos>', "good": v, "bad": w, "subj": z}
            for n, v, w, z in [("dog", "is", "are", "sg"), ("dogs", "are", "is", "pl")] * 205]
    rows = [{**r, "sentence": r["sentence"].replace("the", f"the{i}", 1)} for i, r in enumerate(rows)]
    rows[3]["sentence"] = rows[3]["sentence"].replace("said", "said\tquietly")
    f = tmp_path / "pandas.tab"
    pd.DataFrame(rows).to_csv(f, sep="\t", index=False)
    ds = _generic(f, columns=COLS, properties={"z_c": "subj"}, strip_tokens=["<eos>"])
    assert len(ds) == 410 and ds.examples[0].words[-1] == '"'
    assert "<eos>" not in {w for e in ds.examples for w in e.words}
    with pytest.raises(DataError):  # literal reading of the same file cannot split it right
        _generic(f, columns=COLS, quoting="none")


def test_non_utf8_file_names_the_line(tmp_path):
    f = tmp_path / "latin1.tsv"
    f.write_bytes("sentence\tgood\tbad\nthe dog ***mask*** here\tis\tare\nthe caf\xe9 ***mask*** ok\tis\tare\n"
                  .encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.tsv:3: not valid UTF-8 \(byte 0xe9\)"):
        _generic(f, columns=COLS)


def test_correct_equal_to_wrong_is_a_data_error(tmp_path):
    f = tmp_path / "same.tsv"
    f.write_text("sentence\tgood\tbad\nthe dog ***mask*** here\tis\tis\n")
    with pytest.raises(DataError, match=r"same.tsv:2: the correct and wrong forms are identical \('is'\)"):
        _generic(f, columns=COLS)


def test_duplicates_are_rejected_or_dropped_with_a_note(tmp_path):
    f = tmp_path / "dups.tsv"
    f.write_text("sentence\tgood\tbad\tid\n" + "the dog ***mask*** here\tis\tare\ta\n"
                 "the cat ***mask*** here\tis\tare\tb\n" + "the dog ***mask*** here\tis\tare\tc\n")
    with pytest.raises(DataError, match=r"1 duplicated sentence\(s\), e.g. 'mine-4'.*dataset.duplicates=drop"):
        _generic(f, columns=COLS)
    ds = _generic(f, columns=COLS, duplicates="drop")
    assert [e.id for e in ds.examples] == ["mine-2", "mine-3"] and "dropped 1 duplicated" in ds.notes[0]
    f.write_text("sentence\tgood\tbad\tid\nthe dog ***mask*** here\tis\tare\ta\n"
                 "the cat ***mask*** here\tis\tare\ta\n")
    with pytest.raises(DataError, match="duplicated id"):
        _generic(f, columns={**COLS, "id": "id"})


def test_dataset_config_keys_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['colums'\] for dataset type 'generic'"):
        load_dataset({"type": "generic", "path": "x.tsv", "colums": {}}, tmp_path)
    with pytest.raises(ConfigError, match="dataset.max_examples='many' must be an integer or null"):
        load_dataset({"type": "synthetic", "max_examples": "many"}, tmp_path)


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
