"""RAVEL's Cause, Isolate and disentanglement (cprobe.metrics.ravel), by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cprobe.metrics import ravel as M


def test_cause_is_the_share_of_edits_that_output_the_source_value():
    # 5 edits on prompts querying A; the source entities' A values are [2, 0, 1, 1, 3]; the model now says
    # [2, 0, 0, 1, 1]: 3 of 5 carry the source's value
    assert M.cause([2, 0, 0, 1, 1], [2, 0, 1, 1, 3]) == pytest.approx(3 / 5)


def test_isolate_is_the_share_of_edits_that_keep_the_base_value():
    # 4 edits targeting A on prompts querying B; the base entities' B values [1, 1, 0, 2]; answers [1, 0, 0, 0]:
    # 2 of 4 keep it
    assert M.isolate(np.array([1, 0, 0, 0]), np.array([1, 1, 0, 2])) == pytest.approx(2 / 4)
    assert M.isolate(["paris", "rome"], ["paris", "oslo"]) == pytest.approx(1 / 2)  # any comparable labels


def test_disentangle_is_the_mean_of_cause_and_isolate():
    assert M.disentangle(0.6, 0.5) == pytest.approx(0.55)
    assert M.disentangle(1.0, 0.0) == pytest.approx(0.5)  # the whole-vector swap at the embeddings: all cause
    assert math.isnan(M.disentangle(float("nan"), 1.0))


def test_no_edit_is_nan_and_mismatched_inputs_are_refused():
    assert math.isnan(M.cause([], []))
    with pytest.raises(ValueError, match="two 1-D arrays of one length"):
        M.isolate([1, 2], [1])
