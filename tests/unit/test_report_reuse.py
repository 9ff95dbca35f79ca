"""`cprobe collect` over what it collected copies a study's report whose table, code and libraries are unchanged
(cprobe.report.reuse), and draws it again on any change: a job's table, a written file, the code, a task that does not
declare its report a function of its table."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cprobe.errors import CprobeError
from cprobe.outputs import collect
from cprobe.report import reuse
from cprobe.tasks import Uses, probing
from tests.unit.test_extract_and_jobs import _job


@pytest.fixture
def drawn(monkeypatch):
    """The probing reports drawn (the calls of probing.report)."""
    calls = []
    original = probing.report

    def report(table, out_dir):
        calls.append(len(table))
        return original(table, out_dir)

    monkeypatch.setattr(probing, "report", report)
    return calls


def _files(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.suffix in (".png", ".md", ".csv")
            and p.name.startswith(("accuracy", "probing"))}


def test_an_unchanged_table_reuses_its_report_byte_for_byte(tmp_path, drawn, caplog):
    _job(tmp_path, "probe=a")
    _job(tmp_path, "probe=b")
    collect(tmp_path)
    first = _files(tmp_path)
    assert drawn == [4] and "accuracy_by_layer.png" in first
    manifest = json.loads((tmp_path / reuse.MANIFEST).read_text())
    assert set(manifest) == {""} and "accuracy_by_layer.png" in manifest[""]["files"]
    with caplog.at_level("INFO", logger="cprobe"):
        collect(tmp_path)
    assert drawn == [4], "drawn again over the same table"
    assert "report copied from the last collect" in caplog.text
    assert _files(tmp_path) == first
    assert json.loads((tmp_path / reuse.MANIFEST).read_text()) == manifest


def test_a_changed_job_a_touched_file_or_other_code_draws_it_again(tmp_path, drawn, monkeypatch):
    _job(tmp_path, "probe=a")
    collect(tmp_path)
    _job(tmp_path, "probe=b")  # a new job: another table
    collect(tmp_path)
    assert drawn == [2, 4]
    (tmp_path / "accuracy_by_layer.png").write_bytes(b"edited")  # a figure edited since: drawn, the edit replaced
    collect(tmp_path)
    assert drawn == [2, 4, 4] and (tmp_path / "accuracy_by_layer.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "accuracy_by_layer.png").unlink()  # one deleted
    collect(tmp_path)
    assert drawn == [2, 4, 4, 4] and (tmp_path / "accuracy_by_layer.png").is_file()
    collect(tmp_path)
    assert drawn == [2, 4, 4, 4]
    monkeypatch.setattr(reuse, "code_digest", lambda module: "another cprobe")  # an edited source, a new pandas
    collect(tmp_path)
    assert drawn == [2, 4, 4, 4, 4]


def test_a_task_that_does_not_declare_it_is_always_drawn(tmp_path, drawn, monkeypatch):
    monkeypatch.setattr(probing, "USES", Uses(groups=probing.USES.groups))
    _job(tmp_path, "probe=a")
    collect(tmp_path)
    collect(tmp_path)
    assert drawn == [2, 2] and not (tmp_path / reuse.MANIFEST).exists()


def test_a_manifest_cprobe_did_not_write_is_not_read(tmp_path, drawn):
    _job(tmp_path, "probe=a")
    collect(tmp_path)
    owned = tmp_path / ".cprobe-outputs.json"
    kept = json.loads(owned.read_text())
    owned.write_text(json.dumps({"files": [f for f in kept["files"] if f != reuse.MANIFEST]}))
    mine = (tmp_path / reuse.MANIFEST).read_bytes()
    with pytest.raises(CprobeError, match=reuse.MANIFEST.replace(".", r"\.")):  # not cprobe's: never overwritten
        collect(tmp_path)
    assert drawn == [2, 2] and (tmp_path / reuse.MANIFEST).read_bytes() == mine


def test_the_key_is_the_table_the_study_and_the_code(tmp_path):
    t = pd.DataFrame({"layer": [0, 1], "accuracy": [0.5, 0.75], "probe": ["linear", "linear"]})
    k = reuse.key("probing", t, probing)
    assert k == reuse.key("probing", t.copy(), probing) and len(k) == 64
    assert reuse.key("probing", t.assign(accuracy=[0.5, 0.76]), probing) != k
    assert reuse.key("reliability", t, probing) != k
    assert reuse.key("probing", t[["accuracy", "layer", "probe"]], probing) != k  # column order is what is drawn
    assert reuse.key("probing", t.assign(bad=[object(), object()]), probing) is None  # no Parquet: always drawn
    assert reuse.code_digest(probing).count("|") == len(reuse.LIBRARIES)
