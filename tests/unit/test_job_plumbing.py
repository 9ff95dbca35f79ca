"""Probing task wiring, run-dir names, progress logging, catalog descriptions, corrupt cached probes/models."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from cprobe.catalog import describe
from cprobe.data.base import Dataset, Example
from cprobe.errors import DataError
from cprobe.job import JobContext
from cprobe.pipeline import dir_suffix
from cprobe.progress import track
from cprobe.metrics.baselines import majority_baseline
from cprobe.probes.grid import fit_cached_many
from cprobe.tasks.probing import fit_task, property_labels, score


def test_majority_baseline_hand_computed():
    # train majority is class 1 (3 of 4); test has 2 of 5 ones -> 0.4 (argmin would give 0.6)
    assert majority_baseline(np.array([1, 1, 0, 1]), np.array([0, 1, 0, 1, 0])) == pytest.approx(0.4)


class _SpyProbe:
    """Records what fit received; predicts class 0."""

    def fit(self, X, y, X_val=None, y_val=None):
        self.fit_args = (X, y, X_val, y_val)
        return self

    def score(self, X, y):
        return float((y == 0).double().mean())


def test_fitting_and_scoring_selects_on_the_validation_split_and_scores_on_test():
    X = torch.arange(20, dtype=torch.float32)[:, None]
    y = np.array([0, 1] * 10)
    y[3] = -1  # "none": left out everywhere
    splits = {"train": np.arange(0, 10), "val": np.arange(10, 15), "test": np.arange(15, 20)}
    probe = _SpyProbe()
    ((fitted, source, seconds),) = fit_cached_many([fit_task(probe, X, y, splits)], None)  # the study's path
    row = score(fitted, X, y, splits, source, seconds)
    _, ytr, Xva, yva = probe.fit_args
    assert len(ytr) == 9 and Xva is not None and Xva[:, 0].tolist() == [10, 11, 12, 13, 14]
    assert (row["n_train"], row["n_val"], row["n_test"]) == (9, 5, 5)
    assert row["accuracy"] == pytest.approx(2 / 5) and row["majority"] == pytest.approx(2 / 5)


def _ctx(tmp_path) -> JobContext:
    return JobContext(cfg={"seed": 0}, out_dir=tmp_path, data_root=tmp_path, cache_root=tmp_path)


def _ds(z_e: str) -> Dataset:
    ex = tuple(Example(str(i), ("a", "b"), 1, "b", "c", {"z_c": "sg" if i % 2 else "pl", "z_e": z_e}) for i in range(6))
    return Dataset("d", ex, ("z_c", "z_e"))


def test_single_valued_property_is_skipped_loudly_and_none_left_is_an_error(tmp_path):
    ctx = _ctx(tmp_path)
    labels = property_labels(_ds("none"), ["z_c", "z_e"], ctx)
    assert list(labels) == ["z_c"] and "skipping property z_e" in ctx.warnings[0]
    with pytest.raises(DataError, match="nothing to probe"):
        property_labels(_ds("sg"), ["z_e"], _ctx(tmp_path))


def test_run_dir_suffix_is_short_and_has_no_paths():
    assert dir_suffix("probe=mlp,seed=3") == "probe=mlp,seed=3"
    assert dir_suffix("dataset.path=/home/me/data/agreement.tsv,layers=2") == "dataset.path=agreement.tsv,layers=2"
    long = dir_suffix(",".join(f"model.tiny.train.key{i}=value{i}" for i in range(20)))
    assert len(long) <= 100 and "/" not in long and long == dir_suffix(",".join(
        f"model.tiny.train.key{i}=value{i}" for i in range(20)))  # stable


@pytest.mark.parametrize("bars", [True, False])
def test_progress_logs_one_line_periodically_with_an_eta_bars_or_not(caplog, monkeypatch, bars):
    """Not a terminal, or progress off (`--smoke`): a log line every `every_s` seconds with an ETA, never silence."""
    import cprobe.progress as progress

    clock = iter([0.0, 10.0, 20.0, 30.0, 40.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="cprobe"):
        assert list(track(range(3), "probes", enabled=bars, every_s=0.0)) == [0, 1, 2]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["probes: 1/3 (33%) after 10 s, ETA 20 s", "probes: 2/3 (67%) after 20 s, ETA 10 s",
                     "probes: 3/3 (100%) after 30 s", "probes: 3 done in 40 s"]


def test_progress_eta_message_formats_long_durations():
    from cprobe.progress import eta_message

    assert eta_message("train", 1, 4, 200.0) == "train: 1/4 (25%) after 3 min 20 s, ETA 10 min 00 s"
    assert eta_message("train", 5, None, 4000.0) == "train: 5 done after 1 h 06 min"


def test_list_descriptions_are_whole_sentences(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("# @package _global_\n# The reliability study on the tiny BERT, with the\n# paper's grids. More.\nname: x\n")
    assert describe(f) == "The reliability study on the tiny BERT, with the paper's grids."
    conf = Path(__file__).resolve().parents[2] / "conf"
    for path in conf.rglob("*.yaml"):
        d = describe(path)
        assert not d or d.count("(") == d.count(")"), (path, d)


def test_corrupt_cached_probe_is_refit(tmp_path):
    from cprobe.probes import build_probe
    from cprobe.tasks import sites as rel

    X = torch.randn(60, 4, generator=torch.Generator().manual_seed(0))
    y = (X[:, 0] > 0).long()
    cfg = {"name": "linear", "lrs": [0.1], "epochs": 2, "batch_size": 16, "seed": 0}
    rel._MEMO.clear()
    rel.memo_probe({"k": 1}, build_probe(cfg), X, y, tmp_path)
    (f,) = tmp_path.glob("*.safetensors")
    data = bytearray(f.read_bytes())
    data[-2] ^= 0x01
    f.write_bytes(bytes(data))
    rel._MEMO.clear()
    _, source = rel.memo_probe({"k": 1}, build_probe(cfg), X, y, tmp_path)
    assert source == "fit"
    rel._MEMO.clear()


def test_tiny_model_dir_with_a_flipped_bit_is_not_complete(tmp_path):
    from cprobe.cache import entry_problem
    from cprobe.io import write_manifest
    from cprobe.models.tiny import _FILES, _key_problem

    def _is_complete(path, key):  # what ensure_tiny_model's checked entry accepts for ``key``
        return entry_problem(path, lambda p: _key_problem(p, key)) is None

    for name in _FILES:
        (tmp_path / name).write_bytes(b"x" * 32)
    (tmp_path / "training.json").write_text(json.dumps({"key": "k"}))
    write_manifest(tmp_path, ["config.json", "model.safetensors"])
    assert _is_complete(tmp_path, "k") and not _is_complete(tmp_path, "other")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 31 + b"y")
    assert not _is_complete(tmp_path, "k")


def test_majority_baseline_takes_tensors_and_the_reliability_oracles_use_it():
    assert majority_baseline(torch.tensor([2, 2, 0]), torch.tensor([2, 0, 0, 0])) == pytest.approx(0.25)
    import cprobe.tasks.reliability as rel

    assert rel.majority_baseline is majority_baseline


def test_a_corrupt_cached_model_is_reported_once_and_rebuilt(tmp_path, caplog):
    """The double-checked lock used to warn twice about the same failed checksum."""
    from cprobe.io import write_manifest
    from cprobe.models.tiny import _FILES, cached_build

    builds = []

    def build(d: Path) -> None:
        builds.append(d)
        for name in _FILES:
            (d / name).write_bytes(b"x" * 32)
        (d / "training.json").write_text(json.dumps({"key": "k"}))
        write_manifest(d, ["config.json", "model.safetensors"])

    out = cached_build(tmp_path, "m", "k", build)
    assert cached_build(tmp_path, "m", "k", build) == out and len(builds) == 1
    (out / "model.safetensors").write_bytes(b"y" * 32)
    with caplog.at_level(logging.WARNING):
        cached_build(tmp_path, "m", "k", build)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(builds) == 2 and len(warnings) == 1 and "model.safetensors failed its checksum" in warnings[0], warnings


def test_a_dataset_note_is_logged_once_per_job(tmp_path, caplog):
    """`dropped 7 duplicated sentence(s)` was logged by the loader and again by the task (twice per sva run)."""
    from cprobe.data.registry import load_dataset

    f = tmp_path / "dups.tsv"
    f.write_text("sentence\tcorrect\twrong\tsubject_number\n" + "the dog ***mask*** here\tis\tare\tsg\n" * 2
                 + "the dogs ***mask*** here\tare\tis\tpl\n")
    ctx = _ctx(tmp_path)
    with caplog.at_level(logging.INFO):
        ds = load_dataset({"name": "generic", "path": str(f), "duplicates": "drop", "properties": {"z_c": "subject_number"},
                           "columns": {"sentence": "sentence", "correct": "correct", "wrong": "wrong"}}, tmp_path)
        for _ in range(3):  # e.g. a task that reads its dataset twice, or a note repeated by a helper
            for note in ds.notes:
                ctx.warn(note)
    logged = [r.getMessage() for r in caplog.records if "duplicated" in r.getMessage()]
    assert logged == ["dropped 1 duplicated sentence(s) of generic (kept the first of each)"]
    assert ctx.warnings == logged


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_cached_model_dirs_follow_the_umask(tmp_path, umask):
    """mkdtemp made cached model directories 0700: unreadable to collaborators sharing the cache."""
    import os
    import stat

    from cprobe.io import write_manifest
    from cprobe.models.tiny import _FILES, cached_build

    def build(d: Path) -> None:
        for name in _FILES:
            (d / name).write_bytes(b"x")
        (d / "training.json").write_text(json.dumps({"key": "k"}))
        write_manifest(d, ["config.json"])

    old = os.umask(umask)
    try:
        out = cached_build(tmp_path / "models", "m", "k", build)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((out / "checksums.json").stat().st_mode) == 0o666 & ~umask


def test_long_phases_report_through_cprobe_progress_only():
    """A bare tqdm bar is silent off a terminal (CI, SLURM, a log file): every long phase goes through
    cprobe.progress (a log line with an ETA there), so no other module of src/ imports tqdm."""
    import ast

    src = Path(__file__).resolve().parents[2] / "src" / "cprobe"
    users = []
    for f in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "tqdm" for n in names):
                users.append(str(f.relative_to(src)))
    assert users == ["progress.py"]
