"""Activation cache and checksummed IO: hits, partial hits, corrupt entries (torn files, bit flips) rebuilt,
concurrent writers, every cache kind listed and cleared, files readable by others."""

from __future__ import annotations

import os
import stat
import threading

import torch

from cprobe.cache import CACHE_KINDS, ActivationCache, cache_entries, cache_key, clear_cache
from cprobe.io import atomic_save_tensors, atomic_write_bytes, load_tensors, verify_manifest, write_manifest

FIELDS = {"model": "m", "weights": "w", "dataset": "d", "data": "f", "formatter": {"positions": ["target"]}}


def _compute(calls):
    def compute(names):
        calls.append(list(names))
        return {k: torch.full((4, 3), float(len(k))) for k in names}
    return compute


def test_hit_and_partial_names(tmp_path):
    cache, calls = ActivationCache(tmp_path), []
    acts, hit = cache.get_or_compute(FIELDS, ["L0", "L2.block"], 4, _compute(calls))
    assert not hit and calls == [["L0", "L2.block"]] and acts["L2.block"][0, 0] == 8
    acts, hit = cache.get_or_compute(FIELDS, ["L2.block", "L0"], 4, _compute(calls))
    assert hit and len(calls) == 1
    acts, hit = cache.get_or_compute(FIELDS, ["L0", "L1x", "L2.block"], 4, _compute(calls))
    assert not hit and calls[-1] == ["L1x"]  # only the missing tensor is computed


def test_key_changes_with_any_field():
    assert cache_key(FIELDS) != cache_key({**FIELDS, "formatter": {"positions": ["first"]}})
    assert cache_key(FIELDS) == cache_key(dict(reversed(FIELDS.items())))


def test_torn_entry_is_rebuilt(tmp_path):
    cache, calls = ActivationCache(tmp_path), []
    cache.get_or_compute(FIELDS, ["L0"], 4, _compute(calls))
    f = next((tmp_path / "activations").rglob("L0/*.safetensors"))
    f.write_bytes(f.read_bytes()[:20])
    acts, hit = cache.get_or_compute(FIELDS, ["L0"], 4, _compute(calls))
    assert not hit and len(calls) == 2 and acts["L0"].shape == (4, 3)


def test_bit_flip_inside_tensor_data_is_detected_and_rebuilt(tmp_path):
    """The header (shapes, dtype) stays intact, so only the checksum can tell: the entry must be recomputed."""
    cache, calls = ActivationCache(tmp_path), []
    cache.get_or_compute(FIELDS, ["L0"], 4, _compute(calls))
    f = next((tmp_path / "activations").rglob("L0/*.safetensors"))
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x40  # inside the last float of the tensor payload
    f.write_bytes(bytes(data))
    acts, hit = cache.get_or_compute(FIELDS, ["L0"], 4, _compute(calls))
    assert not hit and len(calls) == 2
    torch.testing.assert_close(acts["L0"], torch.full((4, 3), 2.0))


def test_wrong_length_entry_is_rebuilt(tmp_path):
    cache, calls = ActivationCache(tmp_path), []
    cache.get_or_compute(FIELDS, ["L0"], 4, _compute(calls))
    _, hit = cache.get_or_compute(FIELDS, ["L0"], 5, lambda k: {n: torch.zeros(5, 3) for n in k})
    assert not hit


def test_concurrent_jobs_extract_once(tmp_path):
    calls, results = [], []

    def job():
        results.append(ActivationCache(tmp_path).get_or_compute(FIELDS, ["L0", "L1"], 4, _compute(calls))[1])

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(results) == [False, True, True, True]


def test_disabled_cache_always_computes(tmp_path):
    calls = []
    ActivationCache(tmp_path, enabled=False).get_or_compute(FIELDS, ["L0"], 4, _compute(calls))
    ActivationCache(tmp_path, enabled=False).get_or_compute(FIELDS, ["L0"], 4, _compute(calls))
    assert len(calls) == 2 and not (tmp_path / "activations").exists()


def test_every_cache_kind_is_listed_and_cleared(tmp_path):
    ActivationCache(tmp_path).get_or_compute(FIELDS, ["L0"], 4, _compute([]))
    (tmp_path / "models" / "tiny-bert-abc").mkdir(parents=True)
    (tmp_path / "models" / "tiny-bert-abc" / "training.json").write_text('{"kind": "bert"}')
    atomic_save_tensors(tmp_path / "probes" / "p.safetensors", {"w": torch.zeros(2)})
    atomic_save_tensors(tmp_path / "probe_fits" / "f.safetensors", {"w": torch.zeros(2)})
    atomic_save_tensors(tmp_path / "finetuned" / "clf-k.safetensors", {"w": torch.zeros(2)}, {"config": "{}"})
    (tmp_path / "cloze" / "k").mkdir(parents=True)
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "batch_limits.json").write_text("{}")
    kinds = sorted(e[0] for e in cache_entries(tmp_path))
    assert kinds == sorted(CACHE_KINDS) == ["activations", "cloze", "engine", "finetuned", "models", "probe_fits",
                                            "probes"]
    assert clear_cache(tmp_path, "probes") == 1 and not list((tmp_path / "probes").iterdir())
    assert clear_cache(tmp_path) == 6
    assert list(cache_entries(tmp_path)) == []


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
