"""Caches have one owner: every directory runs write under the cache root is a registered kind, and `cprobe cache
info` lists what runs wrote (slow: runs the CLI, in process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cprobe.cache import KINDS, unregistered
from tests.cli import REPO, run

pytestmark = pytest.mark.slow


def test_every_directory_a_run_writes_is_a_registered_kind(tmp_path):
    """A reliability smoke run (activations, tiny models, probes) on the suite's cache: nothing unregistered there,
    including what every other test of the suite wrote before."""
    root = Path(os.environ.get("CPROBE_CACHE_DIR", REPO / ".cache" / "cprobe-test"))
    env = {"CPROBE_CACHE_DIR": str(root)}
    r = run("run", "+experiment=sva_tiny_reliability", "--smoke", "intervention=leace", f"paths.output_root={tmp_path}",
            "progress=false", cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    written = {p.name for p in root.iterdir() if p.is_dir()}
    assert {"activations", "models"} <= written
    assert unregistered(root) == [], f"unregistered cache directories {unregistered(root)}; register them in cache.py"
    info = run("cache", "info", cwd=REPO, env=env)
    assert info.returncode == 0 and "activations" in info.stdout
    assert set(KINDS) >= written
