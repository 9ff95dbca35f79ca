"""Linear discriminant analysis (CausalGym eq. 16): ``a ∝ Σ⁻¹(μ₁ − μ₀)`` with shared covariance, in closed form.

The reference fits scikit-learn's ``LinearDiscriminantAnalysis`` (SVD solver, no shrinkage, ``tol = 1e-4``, priors the
class shares). For two classes its weight is ``w = Σ⁺(μ₁ − μ₀)``, Σ the pooled within-class covariance (each class
centred on its mean, divided by n as scikit-learn's solver divides; older releases divided by n − 2, which scales w
but not its direction) and Σ⁺ its pseudo-inverse as that solver forms it: in coordinates standardised by the
within-class standard deviations, keeping the singular values of the scaled, centred data above ``tol``. (Its second
SVD, of the two class means, has rank 1 and cancels: ``coef_ = Σ⁺(μ₁ − μ₀)`` exactly.) That is computed here directly,
in float64 on the CPU as the reference does, from the eigendecomposition of the smaller Gram matrix of the
standardised data (n × n when n ≤ d: CausalGym's 40–200 training pairs against Gemma's d = 640), without importing
scikit-learn; the decision rule is the reference's, ``x·w + b > 0`` with ``b = −w·x̄ − ½ (π₀ − π₁) Δ·w + log(π₁/π₀)``
(x̄ = π₀μ₀ + π₁μ₁). Tested against scikit-learn (``tests/unit/test_directions.py``).
"""

from __future__ import annotations

import math
from typing import Self

import torch
from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, unit


def lda_weight(X: Tensor, y: Tensor, tol: float = 1e-4) -> tuple[Tensor, float, Tensor]:
    """(w, b, classes) of two-class LDA on ``X`` (n, d) with labels ``y`` (module doc): ``w = Σ⁺(μ₁ − μ₀)`` (d,)
    float64, the intercept ``b`` and the two sorted class labels; class 1 where ``x·w + b > 0``."""
    X = X.detach().to("cpu", torch.float64)
    classes, inv, counts = torch.unique(y.detach().cpu(), return_inverse=True, return_counts=True)
    n, d = X.shape
    means = torch.zeros(2, d, dtype=X.dtype).index_add_(0, inv, X) / counts[:, None].to(X.dtype)
    priors = counts.to(X.dtype) / n
    within = X - means[inv]
    std = within.std(0, unbiased=False)
    std[std == 0] = 1.0
    Z = within / std / math.sqrt(n)  # Σ in standardised coordinates = ZᵀZ
    if n <= d:  # ZZᵀ = U S² Uᵀ: Z's right singular vectors are Zᵀ U S⁻¹
        s2, U = torch.linalg.eigh(Z @ Z.T)
        keep = s2 > tol**2
        V = Z.T @ (U[:, keep] / s2[keep].sqrt())
    else:
        s2, V = torch.linalg.eigh(Z.T @ Z)
        keep = s2 > tol**2
        V = V[:, keep]
    delta = means[1] - means[0]
    w = V @ ((V.T @ (delta / std)) / s2[keep]) / std
    xbar = priors @ means
    b = float(-(w @ xbar) - 0.5 * (priors[0] - priors[1]) * (delta @ w) + torch.log(priors[1] / priors[0]))
    return w, b, classes


@DIRECTIONS.register("lda")
class LDA(Direction):
    """Two-class LDA, the reference's (scikit-learn's SVD solver) in closed form (module doc); the direction is its
    weight."""

    supervised = True

    def fit(self, X: Tensor, y: Tensor) -> Self:
        check_binary(X, y)
        self.w_, self.b_, self.classes_ = lda_weight(X, y)
        self.a = unit(self.w_).to(X.device, torch.float32)
        return self

    def score(self, X: Tensor, y: Tensor) -> float:
        """Classification accuracy on held-out activations."""
        above = (X.detach().to("cpu", torch.float64) @ self.w_ + self.b_ > 0).long()
        return float((self.classes_[above] == y.detach().cpu()).double().mean())
