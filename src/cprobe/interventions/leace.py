"""LEACE, least-squares concept erasure (Belrose et al. 2023), in closed form.

    r(x) = x − W⁺ P_{W Σ_xz} W (x − μ),   W = (Σ_xx^{1/2})⁺,

with Z one-hot: the affine edit with the least expected squared change that makes X and Z
uncorrelated (all class means equal), so no linear classifier can beat a constant.

Defaults are concept-erasure's ``LeaceEraser.fit``: Σ_xx estimated with optimal linear shrinkage toward a
scaled identity (Ledoit-Wolf-type, random-matrix-theory coefficients), and the projection mixed with the
orthogonal one when it would increase the total variance (``constrain_cov_trace``). ``shrinkage=False,
constrain_cov_trace=False`` gives the plain closed form with the unbiased sample covariance.
"""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor

from cprobe.errors import ConfigError
from cprobe.interventions.base import INTERVENTIONS, Intervention
from cprobe.interventions.inlp import n_classes_of


@INTERVENTIONS.register("leace")
class LEACE(Intervention):
    """Nullifying. After ``fit``: ``P`` (d, d) oblique projection, ``bias`` (d,) the mean of X
    (``None`` when ``affine=False``), and ``transform(X) = X − (X − bias) (I − P)ᵀ``.
    """

    kind = "nullifying"

    def __init__(self, affine: bool = True, svd_tol: float = 0.01, shrinkage: bool = True,
                 constrain_cov_trace: bool = True) -> None:
        if svd_tol <= 0:
            raise ConfigError(f"svd_tol must be > 0 for numerical stability, got {svd_tol}")
        self.affine = affine
        self.svd_tol = svd_tol
        self.shrinkage = shrinkage
        self.constrain_cov_trace = constrain_cov_trace

    def fit(self, X: Tensor, z: Tensor) -> Self:
        k = n_classes_of(z)
        n, d = X.shape
        x = X.double()
        onehot = torch.nn.functional.one_hot(z.to(X.device), k).double()
        mu = x.mean(0)
        xc = x - mu
        scatter = xc.T @ xc
        sigma_xx = shrunk_covariance(scatter / n, n) if self.shrinkage else scatter / (n - 1)
        sigma_xz = xc.T @ (onehot - onehot.mean(0)) / (n - 1)

        # whitening W = Σ^{-1/2} and its inverse on the non-null eigenspace (pinv's threshold)
        L, V = torch.linalg.eigh((sigma_xx + sigma_xx.T) / 2)
        keep = L > L[-1] * d * torch.finfo(torch.float32).eps
        L = L.clamp_min(0.0)
        W = (V * torch.where(keep, L.rsqrt(), 0.0)) @ V.T
        W_inv = (V * torch.where(keep, L.sqrt(), 0.0)) @ V.T

        u, s, _ = torch.linalg.svd(W @ sigma_xz, full_matrices=False)
        u = u[:, s > self.svd_tol]  # directions of the whitened cross-covariance to erase
        left, right = W_inv @ u, u.T @ W  # I − P = left @ right
        if self.constrain_cov_trace:
            left, right = _constrain_trace(left, right, u, sigma_xx)
        self._left = left.float()  # (d, m)
        self._right = right.float()  # (m, d)
        self.P = torch.eye(d, device=X.device) - self._left @ self._right
        self.bias = mu.float() if self.affine else None
        return self

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        dev = X.device
        x = X.float()
        delta = x - self.bias.to(dev) if self.bias is not None else x
        return (x - (delta @ self._right.to(dev).T) @ self._left.to(dev).T).to(X.dtype)


def shrunk_covariance(S: Tensor, n: int) -> Tensor:
    """Optimal linear shrinkage of a (biased) sample covariance ``S`` toward (tr S / p)·I.

    αS + β(tr S / p)I with α, β from the distribution-free random-matrix estimate (Bai & Silverstein-type
    consistency, arXiv:1308.2608), the estimator concept-erasure uses by default.
    """
    p = S.shape[-1]
    trace = torch.trace(S)
    target = torch.eye(p, dtype=S.dtype, device=S.device) * trace / p
    target_sq = target.square().sum()
    inner = torch.trace(S @ target)
    eps = torch.finfo(S.dtype).eps
    alpha = 1 - (trace * trace * target_sq / n + eps) / (S.square().sum() * target_sq - inner * inner + eps)
    beta = (1 - alpha) * (inner + eps) / (target_sq + eps)
    return alpha * S + beta * target


def _constrain_trace(left: Tensor, right: Tensor, u: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
    """If the oblique eraser P = I − left·right would increase tr Cov, use αP + (1 − α)Q with Q = I − uuᵀ
    (the orthogonal eraser of the same whitened directions) and α ∈ [0, 1] making the trace equal.

    The traces use the low rank m of the edits (O(d²m) instead of d × d products):
    tr PΣPᵀ = tr Σ − 2 tr RΣL + tr (RΣRᵀ)(LᵀL), tr QΣQᵀ = tr Σ − tr uᵀΣu (u orthonormal),
    tr PΣQᵀ = tr Σ − tr RΣL − tr uᵀΣu + tr (RΣu)(uᵀL).
    """
    total = torch.trace(sigma)
    rsl, usu = torch.trace(right @ sigma @ left), torch.trace(u.T @ sigma @ u)
    pp = total - 2 * rsl + torch.trace((right @ sigma @ right.T) @ (left.T @ left))
    if pp <= total:
        return left, right
    qq = total - usu
    pq = total - rsl - usu + torch.trace((right @ sigma @ u) @ (u.T @ left))
    # tr((αP + (1−α)Q) Σ (αP + (1−α)Q)ᵀ) = a α² + b α + c, set equal to tr Σ
    a, b, c = pp - 2 * pq + qq, 2 * pq - 2 * qq, qq - total
    disc = torch.sqrt(b * b - 4 * a * c)
    r1, r2 = (-b - disc) / (2 * a), (-b + disc) / (2 * a)
    alpha = torch.where(r1 > 0, r1, r2).clamp(0, 1)
    # I − (αP + (1−α)Q) = α·left·right + (1 − α)·uuᵀ
    return torch.cat([alpha * left, (1 - alpha) * u], 1), torch.cat([right, u.T], 0)
