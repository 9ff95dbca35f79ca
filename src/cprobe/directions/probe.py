"""L2-regularised logistic-regression probe (CausalGym eq. 13, App. C best setting).

scikit-learn's SAGA solver with an intercept and penalty weight λ (``C = 1/λ``), as in the
reference; the direction is the normalised weight vector. The paper's λ per model:
pythia-14m 10, 31m 10², 70m 10³, 160m/410m 10⁴–10⁵, 1b–2.8b 10⁵–10⁶, 6.9b 10⁶–10⁷.
"""

from __future__ import annotations

import warnings
from typing import Self

from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, from_numpy, to_numpy


@DIRECTIONS.register("probe")
class LogisticDirection(Direction):
    """Logistic regression ``softmax(a·x + b)`` on base activations; ``a`` is the direction."""

    supervised = True
    per_model_lambda = True

    def __init__(self, lam: float = 1.0, max_iter: int = 1000, seed: int = 0) -> None:
        if lam <= 0:
            raise ValueError(f"probe lam must be > 0, got {lam}")
        self.lam, self.max_iter, self.seed = lam, max_iter, seed

    def fit(self, X: Tensor, y: Tensor) -> Self:
        check_binary(X, y)
        self.model_ = LogisticRegression(C=1.0 / self.lam, solver="saga", fit_intercept=True,
                                         max_iter=self.max_iter, random_state=self.seed)
        with warnings.catch_warnings():
            # A capped SAGA run still gives a usable direction, as in the reference.
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.model_.fit(to_numpy(X), y.cpu().numpy())
        self.a = from_numpy(self.model_.coef_[0], X)
        return self

    def score(self, X: Tensor, y: Tensor) -> float:
        """Classification accuracy (the paper reports it on the eval activations)."""
        return float(self.model_.score(to_numpy(X), y.cpu().numpy()))
