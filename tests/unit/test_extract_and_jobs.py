"""Extraction glue, layer specs, job status/resume plumbing, result tables and collection."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from cprobe.cache import ActivationCache
from cprobe.data.base import Dataset, Example
from cprobe.errors import CprobeError, ConfigError
from cprobe.extract import extract, filter_single_token, resolve_layers, task_accuracy
from cprobe.job import config_hash, probe_config, read_status, write_status
from cprobe.models.adapter import ModelAdapter
from cprobe.results import collect, write_table
from tests.conftest import make_random_model


@pytest.mark.parametrize("spec,expected", [
    ("all", [0, 1, 2, 3]), ("last", [3]), (2, [2]), (-1, [3]), ([0, -1, 0], [0, 3]),
])
def test_resolve_layers(spec, expected):
    assert resolve_layers(spec, 3) == expected


@pytest.mark.parametrize("spec", [7, [0, 9], "middle", -9])
def test_resolve_layers_rejects(spec):
    with pytest.raises(ConfigError):
        resolve_layers(spec, 3)


def test_task_accuracy_hand_computed():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, -1.0], [1.0, 1.0]])
    assert task_accuracy(logits) == 0.5  # ties count as wrong: P(correct) must exceed P(wrong)
    assert task_accuracy(None) is None


def _dataset():
    ex = [Example(str(i), tuple(f"the {n} near the guards {v} here".split()), 4, v, w,
                  {"z_c": z, "z_e": "pl"})
          for i, (n, v, w, z) in enumerate([("author", "is", "are", "sg"), ("authors", "are", "is", "pl")] * 3)]
    ex.append(Example("oov", tuple("the author w1 zzz".split()), 3, "zzz", "yyy", {"z_c": "sg", "z_e": "none"}))
    return Dataset("d", tuple(ex), ("z_c", "z_e"))


def test_filter_single_token_drops_and_counts():
    model, tok = make_random_model("bert")
    ad = ModelAdapter(model, tok, "mlm", "m")
    ds, cands, dropped = filter_single_token(ad, _dataset())
    assert dropped == 1 and len(ds) == 6 and cands[0] == (ad.candidate_id("is"), ad.candidate_id("are"))


def test_extract_uses_cache_second_time(tmp_path):
    model, tok = make_random_model("gpt_neox")
    ad = ModelAdapter(model, tok, "causal", "m")
    cache = ActivationCache(tmp_path)
    a = extract(ad, _dataset(), [1, 3], "target", cache, progress=False)
    b = extract(ad, _dataset(), [3, 1], "target", cache, progress=False)
    assert not a.cache_hit and b.cache_hit and a.dropped == 1
    torch.testing.assert_close(a.acts[3], b.acts[3])
    torch.testing.assert_close(a.cand_logits, b.cand_logits)
    assert 0.0 <= b.task_accuracy <= 1.0


def test_status_roundtrip_and_config_hash(tmp_path):
    assert read_status(tmp_path) is None
    write_status(tmp_path, state="done", config_hash="abc")
    assert read_status(tmp_path)["state"] == "done"
    (tmp_path / "status.json").write_text("{broken")
    assert read_status(tmp_path) is None
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_probe_config_applies_patch_seed_device():
    cfg = {"seed": 3, "device": "auto", "probe_patch": {"mlp": {"epochs": 1}}}
    assert probe_config(cfg, {"name": "mlp", "epochs": 8}) == {"name": "mlp", "epochs": 1, "seed": 3, "device": None}
    assert probe_config(cfg, {"name": "linear"})["name"] == "linear"


def test_write_table_and_collect(tmp_path):
    rows = {"task": ["probing"] * 2, "model": ["m", "m"], "layer": [0, 1], "property": ["z_c"] * 2,
            "probe": ["linear"] * 2, "accuracy": [0.5, 0.9], "majority": [0.5, 0.5]}
    for job in ("probe=a", "probe=b"):
        d = tmp_path / job
        write_table(pd.DataFrame(rows), d / "metrics")
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text(f"- {job}\n- +experiment=x\n")
    out = collect(tmp_path)
    t = pd.read_csv(out)
    assert len(t) == 4 and set(t["override.probe"]) == {"a", "b"} and set(t["override.experiment"]) == {"x"}
    assert (tmp_path / "results.md").read_text().startswith("|")
    assert (tmp_path / "accuracy_by_layer.png").stat().st_size > 1000
    with pytest.raises(CprobeError):
        collect(tmp_path / "probe=a" / ".hydra")


def test_no_partial_table_on_failure(tmp_path, monkeypatch):
    """An exception while writing leaves no half-written file behind (atomic replace)."""
    df = pd.DataFrame({"a": [1]})

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    with pytest.raises(RuntimeError):
        write_table(df, tmp_path / "metrics")
    assert list(tmp_path.iterdir()) == []
