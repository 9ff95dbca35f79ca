"""Activation cache and checksummed IO: hits, partial hits, corrupt entries (torn files, bit flips) rebuilt,
concurrent writers, every cache kind listed and cleared, files readable by others; the checked store (atomic,
checksummed, built once under its lock)."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading

import pytest
import torch

from cprobe.cache import (CACHE_KINDS, ActivationCache, cache_entries, cache_key, checked_entry, clear_cache,
                          entry_problem)
from cprobe.data.base import Example
from cprobe.extract import extract_sites
from cprobe.io import atomic_save_tensors, atomic_write_bytes, load_tensors, verify_manifest, write_manifest
from cprobe.models.adapter import ModelAdapter
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.sites import Site
from tests.conftest import make_random_model, write_activations

FIELDS = {"model": "m", "weights": "w", "dataset": "d", "data": "f", "formatter": {"positions": ["target"]}}
L0, L1, L2B = Site(0), Site(1), Site(2, stream="block")


def _items(n=4):
    return [Example(f"x{i}", ("the", ("author", "authors", "guard", "guards")[i % 4], "is", "here"), 2, "is", "are")
            for i in range(n)]


def _adapter():
    """A tiny random BERT whose passes over the model are recorded in ``computed``: the site keys of each."""
    model, tok = make_random_model("bert")
    ad = ModelAdapter(model, tok, "mlm", "bert")
    ad.computed, stream = [], ad.stream

    def counting(items, formatter, read=(), *a, **k):
        ad.computed.append([s.key for s in read])
        yield from stream(items, formatter, read, *a, **k)
    ad.stream = counting
    return ad


def _extract(cache, sites, ad, n=4):
    """({site: tensor}, hit) through extraction's own path (:func:`cprobe.extract.extract_sites`)."""
    acts, _, hit = extract_sites(ad, _items(n), "fp", "d", AgreementFormatter(), sites, None, cache, progress=False)
    return acts, hit


def test_hit_and_partial_names(tmp_path):
    cache, ad = ActivationCache(tmp_path), _adapter()
    acts, hit = _extract(cache, [L0, L2B], ad)
    assert not hit and ad.computed == [[L0.key, L2B.key]] and acts[L2B].shape == (4, 32)
    acts, hit = _extract(cache, [L2B, L0], ad)
    assert hit and len(ad.computed) == 1
    _, hit = _extract(cache, [L0, L1, L2B], ad)
    assert not hit and ad.computed[-1] == [L1.key]  # only the missing tensor is computed


def test_key_changes_with_any_field():
    assert cache_key(FIELDS) != cache_key({**FIELDS, "formatter": {"positions": ["first"]}})
    assert cache_key(FIELDS) == cache_key(dict(reversed(FIELDS.items())))


def test_torn_entry_is_rebuilt(tmp_path):
    cache, ad = ActivationCache(tmp_path), _adapter()
    _extract(cache, [L0], ad)
    f = next((tmp_path / "activations").rglob("L0*/*.safetensors"))
    f.write_bytes(f.read_bytes()[:20])
    acts, hit = _extract(cache, [L0], ad)
    assert not hit and len(ad.computed) == 2 and acts[L0].shape == (4, 32)


def test_bit_flip_inside_tensor_data_is_detected_and_rebuilt(tmp_path):
    """The header (shapes, dtype) stays intact, so only the checksum can tell: the entry must be recomputed."""
    cache, ad = ActivationCache(tmp_path), _adapter()
    first, _ = _extract(cache, [L0], ad)
    f = next((tmp_path / "activations").rglob("L0*/*.safetensors"))
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x40  # inside the last float of the tensor payload
    f.write_bytes(bytes(data))
    acts, hit = _extract(cache, [L0], ad)
    assert not hit and len(ad.computed) == 2
    torch.testing.assert_close(acts[L0], first[L0])  # the same model on the same items (float32 tolerance)


def test_wrong_length_entry_is_rebuilt(tmp_path):
    cache, ad = ActivationCache(tmp_path), _adapter()
    _extract(cache, [L0], ad)
    acts, hit = _extract(cache, [L0], ad, n=5)
    assert not hit and acts[L0].shape[0] == 5


def test_concurrent_jobs_extract_once(tmp_path):
    ad, results = _adapter(), []

    def job():
        results.append(_extract(ActivationCache(tmp_path), [L0, L1], ad)[1])

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ad.computed) == 1 and sorted(results) == [False, True, True, True]


def test_disabled_cache_always_computes(tmp_path):
    ad = _adapter()
    _extract(ActivationCache(tmp_path, enabled=False), [L0], ad)
    _extract(ActivationCache(tmp_path, enabled=False), [L0], ad)
    assert len(ad.computed) == 2 and not (tmp_path / "activations").exists()


def test_every_cache_kind_is_listed_and_cleared(tmp_path):
    def files(named):
        return lambda tmp: named

    act = write_activations(tmp_path, FIELDS, {"L0": torch.zeros(4, 3)})
    checked_entry(tmp_path / "models" / "tiny-bert-abc", files({"training.json": b'{"kind": "bert"}'}), "a model")
    atomic_save_tensors(tmp_path / "probe_fits" / "f.safetensors", {"w": torch.zeros(2)})
    atomic_save_tensors(tmp_path / "finetuned" / "clf-k.safetensors", {"w": torch.zeros(2)}, {"config": "{}"})
    checked_entry(tmp_path / "cloze" / "k", files({"meta.json": b"{}"}), "a cloze table")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "batch_limits.json").write_text("{}")
    checked_entry(tmp_path / "gguf" / "a5fd3b", files({"gguf.json": b'{"file": "m.gguf", "file_type": "Q4_K_M"}'}),
                  "a GGUF model")
    checked_entry(tmp_path / "sae" / "k", files({"quality.json": b'{"fvu": 0.25, "l0": 16.0, "dead_fraction": 0.5}'}),
                  "an SAE")
    assert [e[3] for e in cache_entries(tmp_path) if e[0] == "sae"] == ["fvu=0.25, l0=16, dead_fraction=0.5"]
    checked_entry(tmp_path / "rlace" / "g", files({"game.json": b'{"rank": 2, "steps_run": 900, "stop_reason": "eps"}'}),
                  "an R-LACE game")
    assert [e[3] for e in cache_entries(tmp_path) if e[0] == "rlace"] == ["rank=2, steps_run=900, stop_reason=eps"]
    kinds = sorted(e[0] for e in cache_entries(tmp_path))
    assert kinds == sorted(CACHE_KINDS) == ["activations", "cloze", "engine", "finetuned", "gguf", "models",
                                            "probe_fits", "rlace", "sae"]
    assert clear_cache(tmp_path, "probe_fits") == (1, []) and not list((tmp_path / "probe_fits").iterdir())
    assert clear_cache(tmp_path) == (8, [])
    assert list(cache_entries(tmp_path)) == []
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["activations/" + act.dir.name + ".lock", "cloze/k.lock", "gguf/a5fd3b.lock",
                    "models/tiny-bert-abc.lock", "rlace/g.lock", "sae/k.lock"]  # a job may hold them


def test_checksummed_tensors_roundtrip_and_reject_unchecked_files(tmp_path):
    from safetensors.torch import save_file

    t = {"a": torch.randn(3, 2), "b": torch.arange(4).bfloat16()}
    atomic_save_tensors(tmp_path / "x.safetensors", t, {"note": "kept"})
    back = load_tensors(tmp_path / "x.safetensors")
    assert back is not None and torch.equal(back["a"], t["a"]) and torch.equal(back["b"], t["b"])
    save_file(t, tmp_path / "plain.safetensors")  # no checksums: an older or foreign file is not trusted
    assert load_tensors(tmp_path / "plain.safetensors") is None
    assert load_tensors(tmp_path / "missing.safetensors") is None


def test_manifest_detects_a_changed_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    write_manifest(tmp_path, ["model.safetensors"])
    assert verify_manifest(tmp_path) is None
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 63 + b"\x01")
    assert "failed its checksum" in verify_manifest(tmp_path)


def test_written_files_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "metrics.csv", b"a\n1\n")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "metrics.csv").stat().st_mode)
    assert mode == 0o644  # mkstemp alone would leave 0600: unreadable for collaborators


# ----------------------------------------------------------------------------------------------- the checked store
def _builder(calls, payload=b"abc", sleep=0.0):
    def build(tmp):
        import time

        calls.append(tmp.name)
        time.sleep(sleep)
        (tmp / "weights.bin").write_bytes(payload)  # a file the build writes itself
        return {"table.parquet": payload + b"-t"}   # and one it hands back
    return build


def test_a_checked_entry_is_built_once_then_read(tmp_path):
    calls = []
    entry, hit = checked_entry(tmp_path / "e", _builder(calls), "e")
    assert (entry, hit) == (tmp_path / "e", False) and calls and len(calls) == 1
    assert checked_entry(tmp_path / "e", _builder(calls), "e") == (tmp_path / "e", True) and len(calls) == 1
    assert json.loads((entry / "checksums.json").read_text()).keys() == {"table.parquet", "weights.bin"}
    assert (entry / "table.parquet").read_bytes() == b"abc-t" and (entry / "weights.bin").read_bytes() == b"abc"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary directory left


def test_a_torn_build_is_never_read(tmp_path):
    """A build killed half-way (here: raising after its first file) leaves no entry, only a temporary directory that
    the next builder removes; the entry appears whole or not at all."""
    def torn(tmp):
        (tmp / "weights.bin").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        checked_entry(tmp_path / "e", torn, "e")
    assert entry_problem(tmp_path / "e") == "missing"
    (tmp_path / ".e.tmp-killed.cprobe-tmp").mkdir()  # what a SIGKILLed build leaves (its finally never ran)
    (tmp_path / ".e.tmp-killed.cprobe-tmp" / "weights.bin").write_bytes(b"half")
    calls = []
    assert checked_entry(tmp_path / "e", _builder(calls), "e")[1] is False and len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "e.lock"]
    # a file torn inside a finished entry (truncated on disk) fails its checksum and is never handed back: rebuilt
    (tmp_path / "e" / "weights.bin").write_bytes(b"ab")
    assert entry_problem(tmp_path / "e") is not None
    assert checked_entry(tmp_path / "e", _builder(calls), "e")[1] is False and len(calls) == 2


def test_a_corrupted_file_is_detected_and_the_entry_rebuilt(tmp_path, caplog):
    calls = []
    entry, _ = checked_entry(tmp_path / "e", _builder(calls), "the thing")
    (entry / "weights.bin").write_bytes(b"abd")  # one flipped bit's worth: same size, other bytes
    with caplog.at_level(logging.WARNING):
        assert checked_entry(tmp_path / "e", _builder(calls, b"xyz"), "the thing") == (entry, False)
    assert len(calls) == 2 and (entry / "weights.bin").read_bytes() == b"xyz"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "weights.bin failed its checksum" in warnings[0] and "the thing" in warnings[0]
    # an entry that `valid` rejects (built for another key) is rebuilt too, and `rebuild` rebuilds whatever is there
    assert checked_entry(entry, _builder(calls), "e", valid=lambda p: "another key")[1] is False and len(calls) == 3
    assert checked_entry(entry, _builder(calls), "e", rebuild=True)[1] is False and len(calls) == 4


def test_concurrent_builders_build_a_checked_entry_once_threads(tmp_path):
    calls, hits = [], []

    def job():
        hits.append(checked_entry(tmp_path / "e", _builder(calls, sleep=0.3), "e")[1])

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(hits) == [False, True, True, True]


def _build_in_process(root: str, log_file: str) -> bool:
    from pathlib import Path

    def build(tmp):
        import time

        with open(log_file, "a") as f:  # one line per build, whoever builds
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return {"x.bin": b"built"}

    entry, hit = checked_entry(Path(root) / "e", build, "e")
    assert (entry / "x.bin").read_bytes() == b"built"
    return hit


def test_concurrent_builders_build_a_checked_entry_once_processes(tmp_path):
    """Two processes on one entry: one builds under the file lock, the other waits and reads what it wrote."""
    import multiprocessing

    log_file = tmp_path / "builds.txt"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        hits = pool.starmap(_build_in_process, [(str(tmp_path), str(log_file))] * 2)
    assert sorted(hits) == [False, True] and len(log_file.read_text().splitlines()) == 1


def test_causalgym_task_parts_resume_and_recompute(tmp_path):
    """The per-task store of a CausalGym job: a finished task is read back (same frame, same directions); another
    config key, a forced re-run or a corrupted part computes it again."""
    import pandas as pd

    from cprobe.tasks.causalgym import TaskParts

    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"a": [1.5, 2.0], "b": ["x", "y"]}), {"t/d": torch.arange(3.0)}

    frame, dirs = TaskParts(tmp_path, "k").get("agr/1", compute)
    again = TaskParts(tmp_path, "k")
    assert again.has("agr/1") and not again.has("other")
    frame2, dirs2 = again.get("agr/1", compute)
    assert len(calls) == 1 and frame2.equals(frame) and torch.equal(dirs2["t/d"], torch.arange(3.0))
    assert list(frame["b"]) == ["x", "y"]
    TaskParts(tmp_path, "another key").get("agr/1", compute)
    assert len(calls) == 2 and not TaskParts(tmp_path, "k").has("agr/1")  # the index now holds the other key
    TaskParts(tmp_path, "another key", fresh=True).get("agr/1", compute)
    assert len(calls) == 3
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    (entry / "table.parquet").write_bytes(b"torn")
    TaskParts(tmp_path, "another key").get("agr/1", compute)
    assert len(calls) == 4
