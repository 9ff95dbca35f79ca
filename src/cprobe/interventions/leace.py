"""LEACE, least-squares concept erasure (Belrose et al. 2023), in closed form.

    r(x) = x − W⁺ P_{W Σ_xz} W (x − μ),   W = (Σ_xx^{1/2})⁺,

with Z one-hot: the affine edit with the least expected squared change that makes X and Z
uncorrelated (all class means equal), so no linear classifier can beat a constant.

Defaults are concept-erasure's ``LeaceEraser.fit``: Σ_xx estimated with optimal linear shrinkage toward a
scaled identity (Ledoit-Wolf-type, random-matrix-theory coefficients), and the projection mixed with the
orthogonal one when it would increase the total variance (``constrain_cov_trace``). ``shrinkage=False,
constrain_cov_trace=False`` gives the plain closed form with the unbiased sample covariance.

Streaming (as concept-erasure's ``LeaceFitter``): ``update(X, z)`` merges a batch's moments (mean, co-moments
Σ(x−μ)(x−μ)ᵀ and Σ(x−μ)(z−μ_z)ᵀ, Chan et al.'s pairwise update, float64), so activation sets larger than memory
can be fitted batch by batch; the eraser is solved from the moments when first used. ``fit`` = one update.
"""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor

from cprobe.errors import ConfigError, NotFittedError
from cprobe.interventions.base import INTERVENTIONS, Intervention, check_batch, n_classes_of


@INTERVENTIONS.register("leace")
class LEACE(Intervention):
    """Nullifying. After ``fit``: ``P`` (d, d) oblique projection, ``bias`` (d,) the mean of X
    (``None`` when ``affine=False``), and ``transform(X) = X − (X − bias) (I − P)ᵀ``.
    """

    kind = "nullifying"
    exposes_direction = True

    def __init__(self, affine: bool = True, svd_tol: float = 0.01, shrinkage: bool = True,
                 constrain_cov_trace: bool = True) -> None:
        if svd_tol <= 0:
            raise ConfigError(f"svd_tol must be > 0 for numerical stability, got {svd_tol}")
        self.affine, self.svd_tol = affine, svd_tol
        self.shrinkage, self.constrain_cov_trace = shrinkage, constrain_cov_trace

    def fit(self, X: Tensor, z: Tensor) -> Self:
        n_classes_of(z)  # at least two classes among the labels
        self._moments = None
        return self.update(X, z)._solve()

    CHUNK = 8192
    """Rows merged at a time: a large batch is folded in chunks, so the float64 working copies stay small."""

    def update(self, X: Tensor, z: Tensor) -> Self:
        """Merge a batch into the running moments (any batch sizes; classes may be missing from a batch)."""
        if not check_batch(X, z):
            return self
        if len(X) > self.CHUNK:
            for a in range(0, len(X), self.CHUNK):
                self.update(X[a: a + self.CHUNK], z[a: a + self.CHUNK])
            return self
        x = X.detach().double()
        onehot = torch.nn.functional.one_hot(z.to(X.device).long(), int(z.max()) + 1).double()
        m = getattr(self, "_moments", None)
        if m is not None:  # batches may come from another device than the first
            m = {k: v.to(x.device) if isinstance(v, Tensor) else v for k, v in m.items()}
        if m is not None and onehot.shape[1] < m["mz"].shape[0]:
            onehot = torch.nn.functional.pad(onehot, (0, m["mz"].shape[0] - onehot.shape[1]))
        nb, mx, mz = len(x), x.mean(0), onehot.mean(0)
        xc, zc = x - mx, onehot - mz
        batch = {"n": nb, "mx": mx, "mz": mz, "cxx": xc.T @ xc, "cxz": xc.T @ zc}
        if m is None:
            self._moments = batch
        else:
            if m["mx"].shape != mx.shape:
                raise ConfigError(f"update: batches have {m['mx'].shape[0]} and {mx.shape[0]} features")
            if m["mz"].shape[0] < mz.shape[0]:  # a class not seen before
                grow = mz.shape[0] - m["mz"].shape[0]
                m["mz"] = torch.nn.functional.pad(m["mz"], (0, grow))
                m["cxz"] = torch.nn.functional.pad(m["cxz"], (0, grow))
            n = m["n"] + nb
            dx, dz = mx - m["mx"], mz - m["mz"]
            w = m["n"] * nb / n
            self._moments = {"n": n, "mx": m["mx"] + dx * nb / n, "mz": m["mz"] + dz * nb / n,
                             "cxx": m["cxx"] + batch["cxx"] + w * torch.outer(dx, dx),
                             "cxz": m["cxz"] + batch["cxz"] + w * torch.outer(dx, dz)}
        self._stale, self.fitted_ = True, True
        return self

    def _solve(self) -> Self:
        m = self._moments
        n, mu = m["n"], m["mx"]
        if n < 2 or int((m["mz"] > 0).sum()) < 2:
            raise ConfigError("LEACE needs at least two rows and two classes before it can erase")
        d = mu.shape[0]
        scatter = m["cxx"]
        sigma_xx = shrunk_covariance(scatter / n, n) if self.shrinkage else scatter / (n - 1)
        sigma_xz = m["cxz"] / (n - 1)

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
        self._P = torch.eye(d, device=mu.device) - self._left @ self._right
        self._bias = mu.float() if self.affine else None
        self._stale = False
        return self

    def _current(self) -> None:
        """Solve from the moments if batches arrived since the last solve."""
        if getattr(self, "_moments", None) is None:
            raise NotFittedError(self, "fit(X, z) or update(X, z)")
        if self._stale:
            self._solve()

    @property
    def P(self) -> Tensor:
        """The (d, d) oblique projection ``I − left·right`` (current with every update)."""
        self._current()
        return self._P

    @property
    def bias(self) -> Tensor | None:
        """The mean of X the affine eraser centres on (``None`` when ``affine=False``)."""
        self._current()
        return self._bias

    def edit_direction(self) -> Tensor | None:
        """The one direction LEACE moves ``x`` along, ``left`` normalised (∝ the class-mean difference for a binary
        Z), when the erased subspace is one-dimensional; None when it is larger (k > 2 classes, or the trace
        constraint mixing in the orthogonal eraser's direction: ``constrain_cov_trace=false`` avoids that)."""
        self._current()
        u, s, _ = torch.linalg.svd(self._left.double(), full_matrices=False)
        if len(s) == 0 or s[0] <= 0 or (len(s) > 1 and s[1] > 1e-6 * s[0]):
            return None
        return u[:, 0].float()

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        self._current()
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
