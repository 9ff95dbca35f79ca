"""scripts/bench_peers.py at a tiny size: every row's equality check passes and the table prints (``-m bench``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.bench


def test_bench_peers_checks_equality_and_prints_the_table(tmp_path):
    peers = [p for p in ("transformer_lens", "nnsight", "pyvene") if importlib.util.find_spec(p)]
    res = subprocess.run([sys.executable, "scripts/bench_peers.py", "--size", "tiny", "--n", "16", "--repeats", "1",
                          "--peers", ",".join(peers), "--json", str(tmp_path / "r.json")], cwd=REPO,
                         capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "| 1-D interchange along a fixed direction at layer 3 |" in res.stdout
    assert "one DAS training step" in res.stdout and "cprobe / floor" in res.stdout
    assert (tmp_path / "r.json").is_file()
