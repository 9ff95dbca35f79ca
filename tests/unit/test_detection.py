"""AxBench's concept-detection metric (issue 46 item 4, :mod:`cprobe.metrics.detection`): per-token projections,
pooled over a text's real tokens, ranked by AUROC — each formula on a hand-computed case."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cprobe.metrics.detection import auroc, orient, pool, token_scores


def test_auroc_by_hand_with_a_tie():
    """Scores 0.1 0.4 0.4 0.8, labels 0 0 1 1: of the 4 (positive, negative) pairs, 0.4 vs 0.4 ties (½) and the other
    three are won, so AUROC = 3.5 / 4 = 0.875 (average ranks 1, 2.5, 2.5, 4: (2.5 + 4 − 3) / 4)."""
    assert auroc(torch.tensor([0.1, 0.4, 0.4, 0.8]), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.875, abs=1e-12)
    # the order of the rows does not matter; the tie still counts one half
    assert auroc(torch.tensor([0.4, 0.8, 0.1, 0.4]), torch.tensor([1, 1, 0, 0])) == pytest.approx(0.875, abs=1e-12)
    assert auroc(torch.tensor([0.8, 0.4, 0.4, 0.1]), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.125, abs=1e-12)
    assert auroc(torch.tensor([3.0, 3.0, 3.0, 3.0]), torch.tensor([0, 1, 0, 1])) == 0.5  # all tied: chance
    assert auroc(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0, 1, 1])) == 1.0


def test_auroc_is_scikit_learns_on_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 200).astype(float)  # many ties
    y = rng.integers(0, 2, 200)
    assert auroc(torch.tensor(s), torch.tensor(y)) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_auroc_refuses_one_class():
    with pytest.raises(ValueError, match="both classes, got 3 positive and 0 negative"):
        auroc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1, 1, 1]))


def test_pooling_reads_real_tokens_only():
    """Row 0 has two real tokens (−1, −3) and one padding slot scored 0: its max is −1, not the padding's 0."""
    s = torch.tensor([[-1.0, -3.0, 0.0], [2.0, 4.0, 9.0]])
    m = torch.tensor([[True, True, False], [True, True, True]])
    assert pool(s, m, "max").tolist() == [-1.0, 9.0]
    assert pool(s, m, "mean").tolist() == [-2.0, 5.0]
    assert pool(s, m, "last").tolist() == [-3.0, 9.0]
    with pytest.raises(ValueError, match="unknown pooling 'min'"):
        pool(s, m, "min")
    with pytest.raises(ValueError, match="a text has no token"):
        pool(s, torch.tensor([[False, False, False], [True, True, True]]), "max")


def test_token_scores_project_and_zero_the_padding():
    H = torch.tensor([[[1.0, 2.0], [3.0, 5.0]]])  # one text, two tokens
    a = torch.tensor([1.0, -1.0])
    assert token_scores(H, torch.tensor([[True, True]]), a).tolist() == [[-1.0, -2.0]]
    assert token_scores(H, torch.tensor([[True, False]]), a).tolist() == [[-1.0, 0.0]]


def test_orient_points_the_direction_to_the_concept():
    a = torch.tensor([1.0, 0.0])
    assert orient(a, torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])).tolist() == [-1.0, 0.0]  # positives lower
    assert orient(a, torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])).tolist() == [1.0, 0.0]
