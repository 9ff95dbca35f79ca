"""The README's benchmark commands run (at a tiny size) and print their ratios: `make bench` (``pytest -m bench``);
`make test` leaves them out."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.bench


def _run(*args: str, timeout: int = 600) -> str:
    res = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                         env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_bench_extract_prints_the_ratio_against_a_bare_loop():
    out = _run("scripts/bench_extract.py", "--size", "tiny", "--n", "32", "--repeats", "1", "--layer", "2")
    assert "every layer / bare =" in out and "cprobe, layer 2 only" in out and "MFU" in out


def test_bench_cache_prints_the_ratios_against_raw_io(tmp_path):
    out = _run("scripts/bench_cache.py", "--n", "300", "--d", "64", "--tensors", "3", "--repeats", "2",
               "--shard-mb", "0.05", "--dir", str(tmp_path))
    assert "cache write / raw =" in out and "cache read / raw =" in out
    assert not list(tmp_path.iterdir())  # cleaned up


def test_bench_stream_fit_prints_peak_rss():
    out = _run("scripts/bench_stream_fit.py", "--n", "3000", "--d", "32", "--shard-mb", "0.1")
    assert "peak RSS" in out and "streaming LEACE fit" in out


def test_bench_threads_prints_the_chosen_threads():
    out = _run("scripts/bench_threads.py", "--repeats", "1")
    assert "cprobe chooses" in out


def test_bench_interventions_on_given_arrays(tmp_path):
    g = np.random.default_rng(0)
    X = g.normal(size=(300, 12)).astype("float32")
    z = (X[:, 0] > 0).astype("int64")
    np.savez(tmp_path / "a.npz", X_train=X[:200], z_train=z[:200], X_test=X[200:], z_test=z[200:])
    out = _run("scripts/bench_interventions.py", "--npz", str(tmp_path / "a.npz"), "--only", "inlp,leace",
               "--inlp-ranks", "2", "--threads", "1")
    assert "inlp" in out.lower() and "leace" in out.lower()


def test_bench_finetune_prints_the_bf16_ratio():
    out = _run("scripts/bench_finetune.py", "--size", "tiny", "--n", "16", "--batch-size", "8", "--max-length", "64")
    assert "bf16 / fp32 =" in out and "fp32:" in out


def test_bench_das_prints_the_batched_ratio_and_equal_directions():
    out = _run("scripts/bench_das.py", "--pairs", "4", "--layers", "1")
    assert "batched / one-at-a-time speed =" in out
    delta = float(out.split("max |Δa| = ")[1].split()[0])
    assert delta < 1e-4, out


def test_bench_head_prints_the_full_head_against_the_candidate_rows():
    out = _run("scripts/bench_head.py", "--shapes", "tiny", "--n", "8", "--repeats", "1", "--das-steps", "2")
    rows = [line for line in out.splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 3 and all("×**" in r for r in rows), out
    assert "DAS, 2 steps × 16 rows" in rows[0] and all("% →" in r for r in rows[1:]), out


def test_bench_lda_prints_the_ratio_and_the_cosine_gap():
    out = _run("scripts/bench_lda.py", "--shapes", "30x64,200x16", "--repeats", "1")
    assert out.count("×**") == 2, out


def test_bench_shared_prints_each_setting_against_the_best_fixed_one_and_torch_s_default():
    """Ten worker processes (five settings at two loads), each importing torch and transformers: minutes on a
    loaded machine."""
    out = _run("scripts/bench_shared.py", "--model", "random", "--size", "tiny", "--busy", "0,1", "--rounds", "1",
               "--seconds", "0.05", "--fit-steps", "5", "--configs",
               "torch default,passive,cprobe,cprobe free,cprobe late", timeout=1800)
    assert "smaller than Gemma 3 270M" in out and "CPU:" in out and out.count("load average") == 2
    assert "cprobe/best" in out and "cprobe/dflt" in out and "cprobe free/best" in out and "/passive" in out
    assert "cprobe late/best" in out
    for line in ("1 busy, body forward, tokens/s: cprobe / best fixed", "1 busy, DAS step, steps/s: cprobe / torch "
                 "default", "0 busy, R-LACE fit, fits/s: cprobe / torch default",
                 "1 busy, DAS step, steps/s: cprobe free / best fixed",
                 "1 busy, body forward, tokens/s: cprobe late / best fixed"):
        assert line in out, out
    assert "0 busy, body forward, tokens/s: cprobe late" not in out  # a late load needs a load


def test_bench_compose_prints_each_memo_against_hydras_own_composition():
    out = _run("scripts/bench_compose.py", "--n", "2")
    rows = [line for line in out.splitlines() if line.startswith(("sweep point", "probing run", "cebab smoke"))]
    assert len(rows) == 3 and all(r.endswith("x") for r in rows), out
