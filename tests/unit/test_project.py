"""The project itself: packaging metadata (no setuptools deprecation warnings on install) and the test summary."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_license_is_an_spdx_expression_and_the_build_backend_accepts_it():
    meta = tomllib.loads(PYPROJECT.read_text())
    assert meta["project"]["license"] == "MIT"  # PEP 639 string, not the deprecated {text = ...} table
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in meta["build-system"]["requires"])
    setuptools = pytest.importorskip("setuptools")
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (77, 0):
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX license strings (pip builds with >=77)")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), str(PYPROJECT))
    noisy = [str(w.message).splitlines()[0] for w in caught if "Deprecat" in w.category.__name__]
    assert not noisy, noisy
    assert dist.metadata.license_expression == "MIT"


def test_skipped_data_dependent_tests_are_named_in_the_summary(tmp_path):
    """Without ../shared/data the data-dependent tests used to skip silently (issue 25): one line says so."""
    import os
    import subprocess
    import sys

    repo = PYPROJECT.parent
    env = {**os.environ, "CPROBE_DATA_DIR": str(tmp_path / "no-data")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/unit/test_datasets.py", "-k", "real_file"], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [l for l in r.stdout.splitlines() if l.startswith("data: ")]
    assert r.returncode == 0 and len(lines) == 1, r.stdout[-2000:]
    assert f"skipped because the data dir {tmp_path / 'no-data'} is not found" in lines[0]
    assert "test_lgd_real_file" in lines[0] and "test_marvin_linzen_real_files" in lines[0]
