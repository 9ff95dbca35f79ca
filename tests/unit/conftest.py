"""Unit tests: one intra-op thread. Their tensors are tiny, and on a shared 2-core box thread
hand-offs cost more than they save (R-LACE's test ran 7x slower with 2 threads)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
