"""Log odds-ratio, OverallOdds and selectivity on hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor

from cprobe.metrics.odds import (
    avg_odds,
    iia,
    log_odds_ratio,
    overall_odds,
    control_selectivity,
    task_accuracy,
)


def label_logprobs(logits: Tensor, y_base: Tensor, y_source: Tensor) -> tuple[Tensor, Tensor]:
    """``(log p(y_b), log p(y_s))`` per row from next-token logits or log-probs (n, V)."""
    logp = torch.log_softmax(logits.float(), -1)
    return logp.gather(1, y_base[:, None]).squeeze(1), logp.gather(1, y_source[:, None]).squeeze(1)


def test_hand_computed_odds_ratio_from_distributions() -> None:
    # clean: p(y_b)=0.6, p(y_s)=0.2; intervened: p*(y_b)=0.25, p*(y_s)=0.5 → log 3 + log 2 = log 6
    clean = torch.tensor([[0.6, 0.2, 0.2]]).log()
    inter = torch.tensor([[0.25, 0.5, 0.25]]).log()
    yb, ys = torch.tensor([0]), torch.tensor([1])
    odds = log_odds_ratio(*label_logprobs(clean, yb, ys), *label_logprobs(inter, yb, ys))
    torch.testing.assert_close(odds, torch.tensor([math.log(6.0)]))


def test_label_logprobs_normalises_logits() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0]])
    lb, ls = label_logprobs(logits, torch.tensor([0]), torch.tensor([2]))
    z = math.log(math.exp(2) + 2)
    torch.testing.assert_close(lb, torch.tensor([2.0 - z]))
    torch.testing.assert_close(ls, torch.tensor([-z]))


def test_no_effect_gives_zero_and_full_flip_doubles_the_gap() -> None:
    lb, ls = torch.tensor([-1.0, -0.5]), torch.tensor([-2.0, -3.0])
    torch.testing.assert_close(log_odds_ratio(lb, ls, lb, ls), torch.zeros(2))
    # intervened model = clean model with the two labels exchanged: 2·(log p(y_b) − log p(y_s))
    torch.testing.assert_close(log_odds_ratio(lb, ls, ls, lb), torch.tensor([2.0, 5.0]))


def test_avg_accuracy_and_iia() -> None:
    base_yb, base_ys = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])
    int_yb, int_ys = torch.tensor([-3.0, -1.0]), torch.tensor([-1.0, -1.5])
    # items: (1) + (2) = 3 ; (−1) + (−0.5) = −1.5 → mean 0.75
    assert avg_odds(base_yb, base_ys, int_yb, int_ys) == pytest.approx(0.75)
    assert task_accuracy(base_yb, base_ys) == pytest.approx(0.5)
    assert iia(int_yb, int_ys) == pytest.approx(0.5)


def test_overall_is_mean_over_layers_of_max_over_regions() -> None:
    table = np.array([[1.0, 3.0, np.nan], [2.0, 0.0, 5.0]])
    assert overall_odds(table) == pytest.approx(4.0)
    assert overall_odds(torch.tensor(table)) == pytest.approx(4.0)


def test_overall_rejects_a_layer_without_sites() -> None:
    with pytest.raises(ValueError):
        overall_odds(np.array([[1.0], [np.nan]]))


def test_selectivity_differences_per_site_before_aggregating() -> None:
    task = np.array([[1.0, 3.0], [2.0, 5.0]])
    control = np.array([[0.0, 3.0], [1.0, 1.0]])
    # per-site diff [[1, 0], [1, 4]] → max 1, 4 → 2.5; difference of overalls would give 4 − 2 = 2
    assert control_selectivity(task, control) == pytest.approx(2.5)
    assert overall_odds(task) - overall_odds(control) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        control_selectivity(task, control[:, :1])


def test_erasure_is_the_reduction_of_the_absolute_log_odds_on_a_hand_computed_case() -> None:
    """Clean log-odds m = log p(y_b) − log p(y_s) per item: 2, −1, 0.5, 3; under the eraser m* = 0.5, −1, −0.5, −3.
    Erasure |m| − |m*| = 1.5, 0, 0, 0 (the third overshoots to the same |m|, the fourth flips: neither erases);
    erased fraction 1 − (0.5 + 1 + 0.5 + 3) / (2 + 1 + 0.5 + 3) = 1 − 5 / 6.5 = 3/13."""
    from cprobe.metrics.odds import erased_fraction, erasure

    base_yb = torch.tensor([-1.0, -2.0, -1.0, -0.5])
    base_ys = torch.tensor([-3.0, -1.0, -1.5, -3.5])  # m = 2, −1, 0.5, 3
    int_yb = torch.tensor([-1.0, -3.0, -2.0, -4.0])
    int_ys = torch.tensor([-1.5, -2.0, -1.5, -1.0])  # m* = 0.5, −1, −0.5, −3
    assert erasure(base_yb, base_ys, int_yb, int_ys).tolist() == pytest.approx([1.5, 0.0, 0.0, 0.0])
    assert erased_fraction(base_yb, base_ys, int_yb, int_ys) == pytest.approx(3 / 13)
    # a perfect eraser (m* = 0 everywhere) removes all of it; the identity none; a sharper model is negative
    assert erased_fraction(base_yb, base_ys, int_yb, int_yb) == pytest.approx(1.0)
    assert erasure(base_yb, base_ys, int_yb, int_yb).tolist() == pytest.approx([2.0, 1.0, 0.5, 3.0])
    assert erased_fraction(base_yb, base_ys, base_yb, base_ys) == 0.0
    assert erasure(base_yb, base_ys, 2 * base_yb, 2 * base_ys).tolist() == pytest.approx([-2.0, -1.0, -0.5, -3.0])
    assert math.isnan(erased_fraction(base_yb, base_yb, int_yb, int_ys))  # nothing to erase
