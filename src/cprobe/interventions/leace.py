"""LEACE, least-squares concept erasure (Belrose et al. 2023), in closed form.

    r(x) = x − W⁺ P_{W Σ_xz} W (x − μ),   W = (Σ_xx^{1/2})⁺,

with Z one-hot: the affine edit with the least expected squared change that makes X and Z
uncorrelated (all class means equal), so no linear classifier can beat a constant.
Matches ``concept_erasure.LeaceFitter(shrinkage=False, constrain_cov_trace=False)``.
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

    def __init__(self, affine: bool = True, svd_tol: float = 0.01) -> None:
        if svd_tol <= 0:
            raise ConfigError(f"svd_tol must be > 0 for numerical stability, got {svd_tol}")
        self.affine = affine
        self.svd_tol = svd_tol

    def fit(self, X: Tensor, z: Tensor) -> Self:
        k = n_classes_of(z)
        n, d = X.shape
        x = X.double()
        onehot = torch.nn.functional.one_hot(z.to(X.device), k).double()
        mu = x.mean(0)
        xc = x - mu
        sigma_xx = xc.T @ xc / (n - 1)
        sigma_xz = xc.T @ (onehot - onehot.mean(0)) / (n - 1)

        # whitening W = Σ^{-1/2} and its inverse on the non-null eigenspace (pinv's threshold)
        L, V = torch.linalg.eigh((sigma_xx + sigma_xx.T) / 2)
        keep = L > L[-1] * d * torch.finfo(torch.float32).eps
        L = L.clamp_min(0.0)
        W = (V * torch.where(keep, L.rsqrt(), 0.0)) @ V.T
        W_inv = (V * torch.where(keep, L.sqrt(), 0.0)) @ V.T

        u, s, _ = torch.linalg.svd(W @ sigma_xz, full_matrices=False)
        u = u[:, s > self.svd_tol]  # directions of the whitened cross-covariance to erase
        self._left = (W_inv @ u).float()  # (d, m)
        self._right = (u.T @ W).float()  # (m, d)
        self.P = torch.eye(d, device=X.device) - self._left @ self._right
        self.bias = mu.float() if self.affine else None
        return self

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        dev = X.device
        x = X.float()
        delta = x - self.bias.to(dev) if self.bias is not None else x
        return (x - (delta @ self._right.to(dev).T) @ self._left.to(dev).T).to(X.dtype)
