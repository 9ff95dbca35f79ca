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


def test_a_match_reads_the_labels_tokens_and_ignores_its_padding():
    """The reference's compute_metrics: every label position equals the generated token or is padding (< 0)."""
    pred = [[5, 6, 7], [5, 6, 7], [5, 9, 7], [5, 6, 8], [4, 6, 7]]
    label = [[5, 6, 7],  # all three read: match
             [5, -1, -1],  # a one-token value: only its token is read
             [5, 6, 7],  # the second token differs
             [5, 6, -1],  # a two-token value: the third generated token is not read
             [5, 6, 7]]  # the first token differs
    np.testing.assert_array_equal(M.matches(pred, label), [True, True, False, True, False])
    assert M.cause(pred, label) == pytest.approx(3 / 5) and M.isolate(pred[:2], label[:2]) == 1.0
    assert M.matches([2, 3], [2, 4]).tolist() == [True, False]  # one label per edit: equality


def test_the_score_over_attributes_is_the_references_mean_of_task_means():
    """compute_disentangle_score: Cause = the targeted attribute's tasks' mean; Isolate = the mean over the other
    attributes of each one's tasks' mean (not the mean over all their tasks); an attribute without a task is skipped."""
    got = M.disentangle_score({"Country": [0.5, 1.0]}, {"Continent": [1.0, 0.0, 1.0], "Language": [0.5], "Latitude": []})
    assert got["cause"] == pytest.approx(0.75)
    assert got["isolate"] == pytest.approx((2 / 3 + 0.5) / 2)  # not 2.5 / 4
    assert got["disentangle"] == pytest.approx((0.75 + (2 / 3 + 0.5) / 2) / 2)
    assert math.isnan(M.disentangle_score({}, {"B": [1.0]})["cause"])


def test_the_mean_over_attributes_takes_each_method_s_own_attributes():
    """A method with rows for some attributes only (DAS gets no training pair where the model answers none right):
    its mean covers those, another method's all of its own; hand-computed."""
    import pandas as pd

    from cprobe.tasks.ravel import _over_attributes

    rows = []
    for method, attrs in (("mean", {"A": (0.2, 0.8), "B": (0.4, 1.0)}), ("das", {"A": (0.6, 0.6)})):
        for a, (c, i) in attrs.items():
            for metric, v in (("cause", c), ("isolate", i), ("disentangle", (c + i) / 2)):
                rows.append({"method": method, "family": "direction", "layer": 6, "source": "all", "attribute": a,
                             "metric": metric, "value": v, "n": 10, "draws": 1, "degenerate": 0})
    out = pd.DataFrame(_over_attributes(pd.DataFrame(rows))).set_index(["method", "metric"])
    assert out.loc[("mean", "cause"), "value"] == pytest.approx(0.3) and out.loc[("mean", "cause"), "n"] == 20
    assert out.loc[("mean", "isolate"), "attributes"] == "A,B"
    assert out.loc[("das", "disentangle"), "value"] == pytest.approx(0.6)
    assert out.loc[("das", "cause"), "attributes"] == "A" and out.loc[("das", "cause"), "n"] == 10
