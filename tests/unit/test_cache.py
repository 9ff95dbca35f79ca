"""Activation cache: hits, partial layer hits, corrupt entries rebuilt, concurrent writers."""

from __future__ import annotations

import threading

import torch

from cprobe.cache import ActivationCache, cache_entries, cache_key, clear_cache

FIELDS = {"model": "m", "weights": "w", "dataset": "d", "data": "f", "position": "target"}


def _compute(calls):
    def compute(layers):
        calls.append(list(layers))
        return {l: torch.full((4, 3), float(l)) for l in layers}, torch.zeros(4, 2)
    return compute


def test_hit_and_partial_layers(tmp_path):
    cache, calls = ActivationCache(tmp_path), []
    acts, scores, hit = cache.get_or_compute(FIELDS, [0, 2], 4, _compute(calls))
    assert not hit and calls == [[0, 2]] and acts[2][0, 0] == 2
    acts, _, hit = cache.get_or_compute(FIELDS, [2, 0], 4, _compute(calls))
    assert hit and calls == [[0, 2]]
    acts, _, hit = cache.get_or_compute(FIELDS, [0, 1, 2], 4, _compute(calls))
    assert not hit and calls[-1] == [1] and acts[1][0, 0] == 1  # only the missing layer is extracted


def test_key_changes_with_any_field(tmp_path):
    assert cache_key(FIELDS) != cache_key({**FIELDS, "position": "first"})
    assert cache_key(FIELDS) == cache_key(dict(reversed(FIELDS.items())))


def test_corrupt_entry_is_rebuilt(tmp_path):
    cache, calls = ActivationCache(tmp_path), []
    cache.get_or_compute(FIELDS, [0], 4, _compute(calls))
    f = next((tmp_path / "activations").rglob("layer_0.safetensors"))
    f.write_bytes(f.read_bytes()[:20])  # truncated
    acts, _, hit = cache.get_or_compute(FIELDS, [0], 4, _compute(calls))
    assert not hit and len(calls) == 2 and acts[0].shape == (4, 3)


def test_wrong_length_entry_is_rebuilt(tmp_path):
    cache, calls = ActivationCache(tmp_path), []
    cache.get_or_compute(FIELDS, [0], 4, _compute(calls))
    _, _, hit = cache.get_or_compute(FIELDS, [0], 5, lambda l: ({0: torch.zeros(5, 3)}, torch.zeros(5, 2)))
    assert not hit


def test_concurrent_jobs_extract_once(tmp_path):
    calls, results = [], []

    def job():
        results.append(ActivationCache(tmp_path).get_or_compute(FIELDS, [0, 1], 4, _compute(calls))[2])

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(results) == [False, True, True, True]


def test_disabled_cache_always_computes(tmp_path):
    calls = []
    ActivationCache(tmp_path, enabled=False).get_or_compute(FIELDS, [0], 4, _compute(calls))
    ActivationCache(tmp_path, enabled=False).get_or_compute(FIELDS, [0], 4, _compute(calls))
    assert len(calls) == 2 and not (tmp_path / "activations").exists()


def test_entries_and_clear(tmp_path):
    ActivationCache(tmp_path).get_or_compute(FIELDS, [0], 4, _compute([]))
    (entry,) = list(cache_entries(tmp_path))
    assert entry[0] == "activations" and entry[2] > 0 and "layers=1" in entry[3]
    assert clear_cache(tmp_path, "activations") >= 1
    assert list(cache_entries(tmp_path)) == []
