"""The Newton logistic regression behind INLP and R-LACE's selection probe, against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.multiclass import OneVsRestClassifier

from cprobe.stats import fit_logistic, l2_for_C, log_loss_and_accuracy
from tests.unit.test_inlp import gaussian_classes


def test_binary_equals_scikit_learn_at_the_same_C():
    X, z = gaussian_classes(500, 8, sep=2.0)
    W, b = fit_logistic(X, z, 2, l2_for_C(0.5, 500))
    ref = LogisticRegression(C=0.5, tol=1e-12, max_iter=100_000).fit(X.double().numpy(), z.numpy())
    np.testing.assert_allclose(W.numpy(), ref.coef_, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), ref.intercept_, atol=1e-6)


def test_one_vs_rest_rows_equal_scikit_learn_and_the_loss_uses_its_probabilities():
    X, z = gaussian_classes(600, 6, k=3, sep=2.0)
    W, b = fit_logistic(X, z, 3, l2_for_C(1.0, 600))
    ref = OneVsRestClassifier(LogisticRegression(tol=1e-12, max_iter=100_000)).fit(X.double().numpy(), z.numpy())
    for r, est in enumerate(ref.estimators_):
        np.testing.assert_allclose(W[r].numpy(), est.coef_[0], atol=1e-6)
    loss, acc = log_loss_and_accuracy(X, z, W, b)
    Xn = X.double().numpy()
    assert loss == pytest.approx(log_loss(z.numpy(), ref.predict_proba(Xn)), abs=1e-6)
    assert acc == pytest.approx(ref.score(Xn, z.numpy()))


def test_binary_loss_and_accuracy_hand_computed():
    """w = 1, b = 0 on x = (0, 2) with y = (1, 1): p = (½, σ(2)); loss = (ln 2 + ln(1 + e⁻²)) / 2; both predicted
    positive only where the logit is > 0, so accuracy ½."""
    X = torch.tensor([[0.0], [2.0]])
    loss, acc = log_loss_and_accuracy(X, torch.tensor([1, 1]), torch.ones(1, 1), torch.zeros(1))
    assert loss == pytest.approx((np.log(2) + np.log1p(np.exp(-2))) / 2)
    assert acc == 0.5


def test_warm_start_reaches_the_same_optimum():
    X, z = gaussian_classes(300, 5, sep=3.0)
    cold = fit_logistic(X, z, 2, 1e-3)
    warm = fit_logistic(X, z, 2, 1e-3, init=(cold[0] * 0.5, cold[1] + 1))
    assert torch.allclose(cold[0], warm[0], atol=1e-8) and torch.allclose(cold[1], warm[1], atol=1e-8)
