"""Benchmarks run only when asked for (``pytest -m bench`` / ``make bench``), never in ``make test``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    if "bench" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="a benchmark: run with `pytest -m bench` (or `make bench`)")
    for item in items:
        if "bench" in item.keywords:
            item.add_marker(skip)
