"""LIBERTy's metrics on hand-computed vectors: ED averaged per change, local order-faithfulness (ties included),
global importance, global OF of perfect / reversed / tied rankings, sensitivity."""

from __future__ import annotations

import numpy as np
import pytest

from cprobe.metrics import liberty as M


def test_ed_averages_within_each_change_then_over_changes():
    true = np.array([[0.2, -0.2], [0.0, 0.0], [0.0, 0.0], [0.4, -0.4]])
    est = np.array([[0.2, -0.2], [0.3, -0.3], [0.1, -0.1], [0.0, 0.0]])
    change = ["a", "a", "a", "b"]
    # l2 per pair: 0, √0.18, √0.02, √0.32; change a: (0 + .4243 + .1414)/3 = .18856, b: .56569 → mean .37712
    assert M.error_distance(true, est, change, "l2") == pytest.approx(
        (np.mean([0, np.sqrt(0.18), np.sqrt(0.02)]) + np.sqrt(0.32)) / 2)
    # the per-pair mean would differ: (0 + .4243 + .1414 + .5657)/4 = .2828
    assert M.error_distance(true, est, change, "l2") != pytest.approx(np.mean([0, .4243, .1414, .5657]), abs=1e-3)
    # cosine: pair 0 → 0, zero true vectors → 1, pair 3 zero estimate → 1; a: 2/3, b: 1
    assert M.error_distance(true, est, change, "cosine") == pytest.approx((2 / 3 + 1) / 2)


def test_sign_agreement_counts_matching_signs_and_ties_match_only_ties():
    a = np.array([[0.5, -0.1, 0.0], [1.0, 1.0, -1.0]])
    b = np.array([[0.2, 0.3, 0.0], [0.1, -0.1, 0.0]])
    np.testing.assert_allclose(M.sign_agreement(a, b), [2 / 3, 1 / 3])


def test_local_order_faithfulness_by_hand():
    # example e1 has changes A and B; e2 has A and C; e3 has only B (no partner: contributes nothing)
    true = np.array([[0.3, -0.3], [0.1, -0.1], [0.2, -0.2], [0.0, 0.0], [0.5, -0.5]])
    est = np.array([[0.2, -0.2], [0.4, -0.4], [0.1, 0.1], [0.0, 0.0], [0.0, 0.0]])
    example = ["e1", "e1", "e2", "e2", "e3"]
    change = ["A", "B", "A", "C", "B"]
    # e1 (A,B): true diff (+.2, −.2), est diff (−.2, +.2) → 0; (B,A) likewise 0
    # e2 (A,C): true diff (.2, −.2), est diff (.1, .1) → 1/2; (C,A) → 1/2
    # ordered change pairs with shared examples: (A,B)=0, (B,A)=0, (A,C)=.5, (C,A)=.5 → mean .25
    assert M.order_faithfulness(true, est, example, change) == pytest.approx(0.25)
    assert M.order_faithfulness(true, true, example, change) == pytest.approx(1.0)
    assert M.order_faithfulness(true, -true, example, change) == pytest.approx(0.0)
    # ties: equal true effects (diff 0) agree only with equal estimates
    tied = np.array([[0.1, -0.1], [0.1, -0.1]])
    assert M.order_faithfulness(tied, tied.copy(), ["e", "e"], ["A", "B"]) == 1.0
    assert M.order_faithfulness(tied, np.array([[0.2, -0.2], [0.1, -0.1]]), ["e", "e"], ["A", "B"]) == 0.0
    assert np.isnan(M.order_faithfulness(tied, tied, ["e", "f"], ["A", "B"]))  # no shared example


def test_local_of_weights_change_pairs_not_examples():
    # (A,B) shares 2 examples with OF 1 and 0, (A,C) shares 1 with OF 1 → per change pair .5, 1 → .75 (not 2/3)
    true = np.array([[1.0], [0.0], [1.0], [0.0], [1.0], [0.0]])
    est = np.array([[1.0], [0.0], [0.0], [1.0], [1.0], [0.0]])
    example = ["e1", "e1", "e2", "e2", "e3", "e3"]
    change = ["A", "B", "A", "B", "A", "C"]
    assert M.order_faithfulness(true, est, example, change) == pytest.approx(0.75)


def test_importance_is_the_mean_over_changes_of_the_absolute_cace():
    effects = np.array([[0.2, -0.2], [0.4, -0.4], [-0.1, 0.1], [0.3, -0.3], [0.0, 0.0]])
    concept = ["a", "a", "a", "b", "b"]
    change = ["a:0→1", "a:0→1", "a:1→0", "b:0→1", "b:1→0"]
    # a: CaCE(0→1) = (.3, −.3) → .6; CaCE(1→0) = (−.1, .1) → .2; mean .4.  b: .6 and 0 → .3
    assert M.importance(effects, concept, change) == pytest.approx({"a": 0.4, "b": 0.3})
    # sensitivity: mean Σ|ICaCE| per pair: a (.4 + .8 + .2)/3, b (.6 + 0)/2
    assert M.sensitivity(effects, concept) == pytest.approx({"a": 1.4 / 3, "b": 0.3})


def test_global_of_of_a_perfect_a_reversed_and_a_tied_ranking():
    gold = {"a": 0.9, "b": 0.5, "c": 0.3, "d": 0.1}
    assert M.global_order_faithfulness(gold, gold) == 1.0
    assert M.global_order_faithfulness(gold, {k: -v for k, v in gold.items()}) == 0.0
    # one swapped neighbour pair of 6 → 5/6
    assert M.global_order_faithfulness(gold, {"a": 0.9, "b": 0.2, "c": 0.3, "d": 0.1}) == pytest.approx(5 / 6)
    # a tie in the method's ranking disagrees with a strict gold order: 1 of 6 pairs
    assert M.global_order_faithfulness(gold, {"a": 0.9, "b": 0.3, "c": 0.3, "d": 0.1}) == pytest.approx(5 / 6)
    # 7 concepts → a multiple of 1/21 (the paper's Table 16 quantisation)
    g7 = {str(i): float(i) for i in range(7)}
    m7 = {**g7, "0": 2.5}
    assert M.global_order_faithfulness(g7, m7) * 21 == pytest.approx(round(M.global_order_faithfulness(g7, m7) * 21))
    assert M.global_order_faithfulness(g7, m7) == pytest.approx(19 / 21)
    assert M.top(gold, 3) == ["a", "b", "c"]


def test_importance_takes_the_absolute_value_of_the_mean_not_the_mean_of_absolute_values():
    # one change whose pairs disagree in sign: CaCE = 0 → importance 0 (a mean of |·| would say .2)
    effects = np.array([[0.2, -0.2], [-0.2, 0.2]])
    assert M.importance(effects, ["a", "a"], ["a:0→1", "a:0→1"]) == pytest.approx({"a": 0.0})
    assert M.sensitivity(effects, ["a", "a"]) == pytest.approx({"a": 0.4})
