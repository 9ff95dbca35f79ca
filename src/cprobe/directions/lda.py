"""Linear discriminant analysis (CausalGym eq. 16): ``a ∝ Σ⁻¹(μ₁ − μ₀)`` with shared covariance."""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, from_numpy, to_numpy


@DIRECTIONS.register("lda")
class LDA(Direction):
    """scikit-learn's LDA (SVD solver, as in the reference); the direction is its weight."""

    supervised = True

    def fit(self, X: Tensor, y: Tensor) -> Self:
        from sklearn.discriminant_analysis import LinearDiscriminantAnalysis  # here: scikit-learn costs seconds

        check_binary(X, y)
        self.model_ = LinearDiscriminantAnalysis(n_components=1).fit(to_numpy(X), y.cpu().numpy())
        self.a = from_numpy(self.model_.coef_[0], X)
        return self

    def score(self, X: Tensor, y: Tensor) -> float:
        """Classification accuracy on held-out activations."""
        return float(self.model_.score(to_numpy(X), y.cpu().numpy()))
