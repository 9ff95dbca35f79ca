"""L2-regularised logistic-regression probe (CausalGym eq. 13, App. C best setting).

The reference fits scikit-learn's ``LogisticRegression(C = 1/λ)`` with an intercept by SAGA; the objective,
Σ log-loss + (λ/2)‖w‖² (intercept unpenalised), is solved here by the project's one logistic-regression solver
(:func:`cprobe.stats.fit_logistic`, Newton steps in float64, the solver INLP and R-LACE use), which reaches the
optimum SAGA approaches (SAGA stops at tol 1e-4 or ``max_iter`` epochs; ``tests/unit/test_directions.py`` checks the
two agree where SAGA converges). The direction is the normalised weight vector. The paper's λ per model:
pythia-14m 10, 31m 10², 70m 10³, 160m/410m 10⁴–10⁵, 1b–2.8b 10⁵–10⁶, 6.9b 10⁶–10⁷.
"""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, unit
from cprobe.stats import fit_logistic, l2_for_C


@DIRECTIONS.register("probe")
class LogisticDirection(Direction):
    """Logistic regression ``σ(w·x + b)`` on base activations; ``a = w/‖w‖``. After ``fit``: ``coef_`` (d,) and
    ``intercept_`` (float64, as scikit-learn's ``coef_[0]`` / ``intercept_[0]``)."""

    supervised = True
    per_model_lambda = True

    def __init__(self, lam: float = 1.0, max_iter: int = 100, seed: int = 0) -> None:
        if lam <= 0:
            raise ValueError(f"probe lam must be > 0, got {lam}")
        if max_iter < 1:
            raise ValueError(f"probe max_iter must be >= 1, got {max_iter}")
        self.lam, self.max_iter, self.seed = lam, max_iter, seed  # seed: kept for configs (Newton is deterministic)

    def fit(self, X: Tensor, y: Tensor) -> Self:
        check_binary(X, y)
        Xd = X.detach().double()
        W, b = fit_logistic(Xd, y.to(Xd.device).long(), 2, l2_for_C(1.0 / self.lam, len(y)), self.max_iter)
        self.coef_, self.intercept_ = W[0], float(b[0])
        self.a = unit(self.coef_.float()).to(X.device)
        return self

    def score(self, X: Tensor, y: Tensor) -> float:
        """Classification accuracy (the paper reports it on the eval activations)."""
        logit = X.detach().double().to(self.coef_.device) @ self.coef_ + self.intercept_
        return float(((logit > 0).long().cpu() == y.cpu()).double().mean())
