"""An empty input file is reported as empty (issue 25), not as "no facts under …" or "missing column(s)"."""

from __future__ import annotations

import pytest

from cprobe.errors import DataError
from tests.unit.test_fact_data import write_lama


# an empty relations.jsonl: tests/unit/test_fact_data.py::test_an_empty_relations_file_says_so


def test_empty_lama_triples_files_are_named(tmp_path):
    from cprobe.data.lama import LamaKeys, load_lama

    base = write_lama(tmp_path)
    for f in (base / "TREx").glob("*.jsonl"):
        f.write_text("")
    with pytest.raises(DataError, match=r"no facts under .*TREx for the kept relations: P19.jsonl, P36.jsonl are empty"):
        load_lama(LamaKeys(path="lama"), tmp_path, "lama")
    write_lama(tmp_path)
    (base / "TREx" / "P36.jsonl").write_text("")
    data = load_lama(LamaKeys(path="lama"), tmp_path, "lama")
    assert list(data.relations) == ["P19", "P36"] and any("empty" in n and "P36.jsonl" in n for n in data.notes)


@pytest.mark.parametrize("content,message", [("", "is empty (dataset.texts)"), ("\n\n", "is empty (dataset.texts)")])
def test_an_empty_liberty_texts_file_says_empty(tmp_path, content, message):
    from cprobe.data.liberty import LibertyKeys, load_liberty

    for suffix in (".jsonl", ".csv"):
        f = tmp_path / f"texts{suffix}"
        f.write_text(content)
        with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_liberty(LibertyKeys(texts=str(f)), tmp_path, "x")


def test_a_liberty_texts_file_with_a_header_only_says_no_rows(tmp_path):
    from cprobe.data.liberty import LibertyKeys, load_liberty
    from cprobe.data.scm import SCM

    f = tmp_path / "texts.csv"
    f.write_text(",".join(["id", "text", "split", *SCM.load("cv").variables]) + "\n")
    with pytest.raises(DataError, match="has a header but no rows"):
        load_liberty(LibertyKeys(texts=str(f)), tmp_path, "x")


@pytest.mark.parametrize("name", ["mine.tsv", "mine.jsonl"])
def test_an_empty_generic_file_says_empty(tmp_path, name):
    from cprobe.data.registry import load_dataset

    (tmp_path / name).write_text("")
    with pytest.raises(DataError, match=r"mine\.\w+ is empty"):
        load_dataset({"name": "generic", "path": str(tmp_path / name), "properties": {"z_c": "n"},
                      "columns": {"sentence": "s", "correct": "c", "wrong": "w"}}, tmp_path)
