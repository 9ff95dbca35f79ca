"""Extraction glue, layer specs, job status/resume plumbing, result tables and collection."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from cprobe.cache import ActivationCache
from cprobe.data.base import Dataset, Example
from cprobe.errors import ConfigError, CprobeError
from cprobe.extract import agreement_items, extract, resolve_layers, task_accuracy
from cprobe.job import config_hash, read_status, write_status
from cprobe.models.adapter import ModelAdapter
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.pipeline import collect
from cprobe.results import write_job, write_table
from tests.conftest import make_random_model


@pytest.mark.parametrize("spec,expected", [
    ("all", [0, 1, 2, 3]), ("last", [3]), ("blocks", [1, 2, 3]), (2, [2]), (-1, [3]), ([0, -1, 0], [0, 3]),
])
def test_resolve_layers(spec, expected):
    assert resolve_layers(spec, 3) == expected


@pytest.mark.parametrize("spec,match", [(7, "out of range"), ([0, 9], "out of range"), ("middle", "use 'all'"),
                                        (-9, "out of range"), ([], "selects no layer"), (True, "use 'all'")])
def test_resolve_layers_rejects(spec, match):
    with pytest.raises(ConfigError, match=match):
        resolve_layers(spec, 3)


def test_task_accuracy_hand_computed():
    scores = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, -1.0], [1.0, 1.0]])
    assert task_accuracy(scores) == 0.5  # ties count as wrong: P(correct) must exceed P(wrong)
    assert task_accuracy(None) is None


def _dataset():
    ex = [Example(str(i), tuple(f"the {n} near the guards {v} here".split()), 4, v, w,
                  {"z_c": z, "z_e": "pl"})
          for i, (n, v, w, z) in enumerate([("author", "is", "are", "sg"), ("authors", "are", "is", "pl")] * 3)]
    ex.append(Example("oov", tuple("the author w1 zzz".split()), 3, "zzz", "yyy", {"z_c": "sg", "z_e": "none"}))
    return Dataset("d", tuple(ex), ("z_c", "z_e"))


def test_agreement_items_drop_and_count_unscorable_items():
    model, tok = make_random_model("bert")
    ad = ModelAdapter(model, tok, "mlm", "m")
    ds, cands, dropped = agreement_items(ad, _dataset())
    assert dropped == {"verb forms not single tokens": 1} and len(ds) == 6
    assert cands[0].tolist() == [ad.candidate_id("is"), ad.candidate_id("are")]


def test_sentences_longer_than_the_model_are_dropped_not_crashed():
    model, tok = make_random_model("bert")  # 64 positions
    ad = ModelAdapter(model, tok, "mlm", "m")
    assert ad.max_length == 64
    long = Example("long", tuple(["the"] * 80 + ["author", "is", "here"]), 81, "is", "are", {"z_c": "sg"})
    ds = Dataset("d", (*_dataset().examples[:6], long), ("z_c", "z_e"))
    kept, _, dropped = agreement_items(ad, ds)
    assert len(kept) == 6 and dropped == {"longer than the model's 64 positions": 1}


def test_the_adapter_remembers_token_lengths_and_candidate_ids_per_tokenizer():
    model, tok = make_random_model("bert")
    ad = ModelAdapter(model, tok, "mlm", "m")
    texts = ["the author is here", "the authors near the guards are here", "zzz"]
    want = [len(ids) for ids in tok(texts, add_special_tokens=True)["input_ids"]]
    calls = []
    real = ad.tok

    class Counting:
        def __call__(self, *a, **kw):
            calls.append("call")
            return real(*a, **kw)

        def encode(self, *a, **kw):
            calls.append("encode")
            return real.encode(*a, **kw)

    ad.tok = counting = Counting()
    assert ad.token_lengths(texts) == want and ad.token_lengths(list(texts)) == want and calls == ["call"]
    ad.token_lengths(texts).append(0)  # the caller's list, not the remembered one
    assert ad.token_lengths(texts) == want
    assert ad.candidate_id("is") == real.encode(" is", add_special_tokens=False)[0]
    assert ad.candidate_id("w1 zzz") is None  # two tokens
    assert ad.candidate_id("is") == ad.candidate_id("is") and calls.count("encode") == 2
    for i in range(5):  # only the last few lists are kept: the first is tokenised again
        ad.token_lengths([f"text {i}"])
    ad.token_lengths(texts)
    assert calls.count("call") == 7
    ad.tok = real  # another tokenizer: asked afresh
    assert ad.token_lengths(texts) == want and ad.candidate_id("is") is not None and calls.count("encode") == 2
    assert counting is not ad.tok


def test_extract_uses_cache_second_time_and_scores_are_the_verb_forms_logits(tmp_path):
    model, tok = make_random_model("gpt_neox")
    ad = ModelAdapter(model, tok, "causal", "m")
    cache = ActivationCache(tmp_path)
    a = extract(ad, _dataset(), [1, 3], "target", cache, progress=False)
    b = extract(ad, _dataset(), [3, 1], "target", cache, progress=False)
    assert not a.cache_hit and b.cache_hit and a.n_dropped == 1
    torch.testing.assert_close(a.acts[3], b.acts[3])
    torch.testing.assert_close(a.scores, b.scores)
    # the (correct, wrong) verb forms' logits, from those rows of the head: their difference is the log-probabilities'
    logp = ad.map(a.dataset.examples, AgreementFormatter(),
                  readout=CandidateTokens(a.candidates, normalise=True)).scores
    assert (logp < 0).all() and not torch.allclose(a.scores, logp, atol=1e-2)
    torch.testing.assert_close(a.scores[:, 0] - a.scores[:, 1], logp[:, 0] - logp[:, 1], atol=1e-5, rtol=1e-5)


def test_status_roundtrip_and_config_hash(tmp_path):
    assert read_status(tmp_path) is None
    write_status(tmp_path, state="done", config_hash="abc")
    assert read_status(tmp_path)["state"] == "done"
    (tmp_path / "status.json").write_text("{broken")
    assert read_status(tmp_path) is None
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def _rows():
    return {"task": ["probing"] * 2, "model": ["m", "m"], "dataset": ["d", "d"], "n_test": [10, 10],
            "layer": [0, 1], "property": ["z_c"] * 2,
            "probe": ["linear"] * 2, "accuracy": [0.5, 0.9], "majority": [0.5, 0.5]}


def test_metric_tables_are_byte_identical_across_runs_timings_kept_apart(tmp_path):
    t1 = pd.DataFrame({**_rows(), "fit_s": [1.0, 2.0], "probe_source": ["fit", "fit"]})
    t2 = pd.DataFrame({**_rows(), "fit_s": [7.0, 9.0], "probe_source": ["disk", "disk"]})
    write_job(t1, tmp_path / "a")
    write_job(t2, tmp_path / "b")
    for f in ("metrics.csv", "metrics.md"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert "fit_s" not in pd.read_csv(tmp_path / "a" / "metrics.csv")
    assert pd.read_csv(tmp_path / "b" / "timings.csv")["fit_s"].tolist() == [7.0, 9.0]


def test_timings_csv_is_always_written_with_the_job_phases(tmp_path):
    """The README lists timings.csv as always written; a table without timing columns used to get none."""
    write_job(pd.DataFrame(_rows()), tmp_path, {"extract_s": 1.5, "probes_s": 3.0})
    t = pd.read_csv(tmp_path / "timings.csv")
    assert list(t.columns) == ["row", "job_extract_s", "job_probes_s"] and t["row"].tolist() == [0, 1]
    assert t["job_probes_s"].tolist() == [3.0, 3.0]


def test_metrics_md_is_compact_constant_columns_once_warnings_once_below(tmp_path):
    rows = {**_rows(), "n_test": [10, 12], "task_accuracy": [float("nan")] * 2,
            "warnings": ["dropped 7 duplicated sentence(s); skipping property z_e: one value"] * 2}
    write_job(pd.DataFrame(rows), tmp_path)
    md = (tmp_path / "metrics.md").read_text()
    head, table, warnings = md.split("\n\n")
    assert head == "All rows: task: probing · model: m · dataset: d · property: z_c · probe: linear · majority: 0.5000 · " \
                   "task_accuracy: n/a"
    assert [c.strip() for c in table.splitlines()[0].split("|")[1:-1]] == ["n_test", "layer", "accuracy"]
    assert len(table.splitlines()) == 4
    assert warnings.splitlines() == ["Warnings:", "- dropped 7 duplicated sentence(s)", "- skipping property z_e: one value"]
    assert md.count("duplicated") == 1
    assert "warnings" in pd.read_csv(tmp_path / "metrics.csv")  # the CSV keeps every column
    write_job(pd.DataFrame({k: v[:1] for k, v in rows.items()}), tmp_path / "one")  # one row: key | value
    one = [[c.strip() for c in line.split("|")[1:-1]] for line in (tmp_path / "one" / "metrics.md").read_text().splitlines()
           if line.startswith("|")]
    assert one[0] == ["key", "value"] and ["accuracy", "0.5000"] in one and ["task_accuracy", "n/a"] in one


def test_metrics_are_float64(tmp_path):
    t = pd.DataFrame({"accuracy": torch.tensor([0.635], dtype=torch.float32).numpy(), "majority": [0.635]})
    write_job(t, tmp_path)
    back = pd.read_parquet(tmp_path / "metrics.parquet")
    assert back["accuracy"].dtype == "float64"


def _job(tmp_path, name, state="done"):
    d = tmp_path / name
    write_table(pd.DataFrame(_rows()), d / "metrics")
    (d / ".hydra").mkdir()
    (d / ".hydra" / "overrides.yaml").write_text(f"- {name}\n- +experiment=x\n")
    write_status(d, state=state, error="boom" if state == "failed" else None)
    return d


def test_collect_aggregates_finished_jobs_with_overrides(tmp_path):
    _job(tmp_path, "probe=a")
    _job(tmp_path, "probe=b")
    out = collect(tmp_path)
    t = pd.read_csv(next(iter(out.results.values())))
    assert len(t) == 4 and set(t["override.probe"]) == {"a", "b"} and set(t["override.experiment"]) == {"x"}
    assert "| probe=a" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "accuracy_by_layer.png").stat().st_size > 1000


def test_collect_names_unfinished_jobs_and_needs_partial(tmp_path):
    _job(tmp_path, "probe=a")
    _job(tmp_path, "probe=b", state="failed")
    d = tmp_path / "probe=c"
    d.mkdir()
    write_status(d, state="running")
    with pytest.raises(CprobeError, match=r"2 job\(s\) not done: probe=b is failed \(boom\); probe=c is running"):
        collect(tmp_path)
    t = pd.read_csv(next(iter(collect(tmp_path, partial=True).results.values())))
    assert set(t["job"]) == {"probe=a"}
    with pytest.raises(CprobeError, match="not a directory"):
        collect(tmp_path / "nope")


def test_no_partial_table_on_failure(tmp_path, monkeypatch):
    """An exception while writing leaves no half-written file behind (atomic replace)."""
    df = pd.DataFrame({"a": [1]})

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    with pytest.raises(RuntimeError):
        write_table(df, tmp_path / "metrics")
    assert list(tmp_path.iterdir()) == []


def test_status_json_is_json(tmp_path):
    write_status(tmp_path, state="interrupted", started=1.0)
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "interrupted"
