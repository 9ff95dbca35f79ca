"""Packaging metadata: `pip install` must not print setuptools deprecation warnings (issue 25)."""

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
