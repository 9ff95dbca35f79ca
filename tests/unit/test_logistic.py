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


def test_states_with_a_massive_coordinate_fit_where_a_float32_hessian_is_not_positive_definite():
    """Gemma 3's residual stream (issue 44): 20 distinct states repeated (CausalGym's region states repeat), one
    coordinate ~5·10⁴. Its float32 Hessian is not positive definite (the products ~2.5·10⁹ round by more than the
    penalty 25), so the step falls back to float64; the result is the optimum (a zero gradient; scikit-learn's L-BFGS
    stops short of it on this conditioning)."""
    from cprobe.stats import _hessian_factor

    g = torch.Generator().manual_seed(0)
    base = torch.randn(20, 640, generator=g, dtype=torch.float64) * 30
    base[:, 0] = 5e4 + torch.randn(20, generator=g, dtype=torch.float64) * 500
    idx = torch.arange(400) % 20
    X, z = base[idx], (idx % 2).long()
    l2 = l2_for_C(1e-4, 400)  # CausalGym's probe λ = 1e4
    Xa = torch.cat([X, X.new_ones(400, 1)], 1)
    pen = torch.full((641,), l2, dtype=torch.float64)
    pen[-1] = 0
    w = torch.full((400,), 0.25 / 400, dtype=torch.float64)  # the first step's weights (p = 1/2)
    H32 = (Xa.float().T @ (w.float()[:, None] * Xa.float())).double() + torch.diag(pen) + 1e-8 * torch.eye(641)
    assert int(torch.linalg.cholesky_ex(H32).info) > 0  # what failed before
    L = _hessian_factor(Xa, Xa.float(), w, pen, 1e-8 * torch.eye(641, dtype=torch.float64))
    torch.testing.assert_close(L @ L.T, Xa.T @ (w[:, None] * Xa) + torch.diag(pen) + 1e-8 * torch.eye(641),
                               rtol=1e-9, atol=1e-6)  # float64's own rounding on entries up to ~6·10⁶
    W, b = fit_logistic(X, z, 2, l2)
    p = torch.sigmoid(X @ W[0] + b[0])
    assert float((X.T @ (p - z) / 400 + l2 * W[0]).abs().max()) < 1e-9 and abs(float((p - z).mean())) < 1e-9

    def objective(w: torch.Tensor, c: float) -> float:
        logit = X @ w + c
        return float((torch.nn.functional.softplus(logit) - z * logit).mean() + 0.5 * l2 * (w * w).sum())

    ref = LogisticRegression(C=1e-4, tol=1e-12, max_iter=100_000).fit(X.numpy(), z.numpy())
    assert objective(W[0], float(b[0])) <= objective(torch.from_numpy(ref.coef_[0]), float(ref.intercept_[0]))
