"""Unit tests: one intra-op thread (``CPROBE_TEST_THREADS`` when set: ``make test-portable``). Their tensors are tiny,
and on a shared 2-core box thread hand-offs cost more than they save (R-LACE's test ran 7x slower with 2 threads)."""

from __future__ import annotations

import pytest

from cprobe.compute import threads
from tests.conftest import numeric_threads


@pytest.fixture(autouse=True)
def _one_thread():
    with threads(numeric_threads(1)):
        yield
