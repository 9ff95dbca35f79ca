"""The two statistics every linear method family shares, implemented once: per-class means and L2 logistic regression.

**Class means** (:class:`ClassMeans`): per-class sums and counts in float64, fed in batches (``update``) or at once.
The ``mean_diff`` intervention (steering by μ_{z′} − μ_ĉ), the ``mean`` direction (μ₁ − μ₀, CausalGym eqs. 14–15)
and the direction-interventions' counterfactual targets (the class means of aᵀx) all read them.

**Logistic regression** (:func:`fit_logistic`): L2-regularised, solved exactly by Newton's method, in float64 on
the data's device. The inner classifier of INLP, the selection probe of R-LACE and the ``probe`` direction
(CausalGym eq. 13: scikit-learn's ``LogisticRegression(C = 1/λ)`` objective, whose optimum SAGA only approaches).
Objective per
output row (binary: one row; k > 2: one-vs-rest rows, solved together):

    mean_i [softplus(xᵢ·w + b) − tᵢ (xᵢ·w + b)] + (l2 / 2) ‖w‖²      (intercept b not penalised)

which is scikit-learn's ``LogisticRegression(C)`` objective with ``l2 = 1 / (C · n)``. Newton steps with
a backtracking (Armijo) line search reach the optimum in ~10 steps where first-order solvers need hundreds
on the anisotropic states of language models — the main reason cprobe's erasers are fast. A fit this small (its
Hessian below :data:`cprobe.compute.FIT_OP_FLOPS`) runs on one thread.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.functional import one_hot, softplus

from cprobe.compute import fit_threads
from cprobe.errors import ConfigError, DataError


class ClassMeans:
    """Per-class sums and counts (float64, on the data's device), added batch by batch; classes may be missing from a
    batch. ``means`` (k, d) in float64 once every class in [0, k) has a row."""

    def __init__(self) -> None:
        self.sums: Tensor | None = None
        self.counts: Tensor | None = None

    def update(self, X: Tensor, z: Tensor) -> ClassMeans:
        """Add the rows ``X`` (n, d) of classes ``z`` (n,); an empty batch adds nothing."""
        if len(z) == 0:
            return self
        zd = z.to(X.device).long()
        k = max(int(zd.max()) + 1, 0 if self.counts is None else len(self.counts))
        sums = torch.zeros(k, X.shape[1], dtype=torch.float64, device=X.device).index_add_(0, zd, X.detach().double())
        counts = torch.bincount(zd, minlength=k)
        if self.counts is not None:
            sums[: len(self.counts)] += self.sums.to(X.device)
            counts[: len(self.counts)] += self.counts.to(X.device)
        self.sums, self.counts = sums, counts
        return self

    def missing(self) -> list[int]:
        """Classes in [0, k) with no row yet."""
        return [] if self.counts is None else (self.counts == 0).nonzero().flatten().tolist()

    def means(self) -> Tensor:
        """(k, d) float64 class means; a class without rows is a DataError."""
        if self.counts is None:
            raise DataError("no rows were added to the class means")
        if self.missing():
            raise DataError(f"classes {self.missing()} have no rows; every class in [0, {len(self.counts)}) needs one")
        return self.sums / self.counts[:, None]


def class_means(X: Tensor, z: Tensor) -> Tensor:
    """(k, d) float64 means of the rows of each class in [0, k) (k = max(z) + 1)."""
    return ClassMeans().update(X, z).means()


def l2_for_C(C: float, n: int) -> float:
    """The per-sample penalty equivalent to scikit-learn's ``C`` on ``n`` rows."""
    if C <= 0:
        raise ConfigError(f"C must be > 0, got {C}")
    return 1.0 / (C * n)


def fit_logistic(X: Tensor, y: Tensor, n_classes: int, l2: float, max_iter: int = 100,
                 tol: float = 1e-9, init: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Weights ``W`` (rows, d) and intercepts ``b`` (rows,) in float64; rows = 1 for k = 2 (the positive side
    is class 1), else k one-vs-rest rows. Stops when every gradient entry is below ``tol`` (mean-loss
    scale) or after ``max_iter`` Newton steps. ``l2`` must be > 0 unless the classes are not separable.
    ``init`` = (W, b) warm-starts from an earlier solution (same optimum, fewer steps)."""
    if l2 < 0:
        raise ConfigError(f"l2 must be >= 0, got {l2}")
    with fit_threads(newton_flops(*X.shape), X.device):
        return _fit_logistic(X, y, n_classes, l2, max_iter, tol, init)


def newton_flops(n: int, d: int) -> float:
    """Flops of one Newton step's Hessian of a logistic fit on ``n`` × ``d`` (its largest op: what decides its
    threads, :func:`cprobe.compute.fit_threads`)."""
    return 2.0 * n * (d + 1) ** 2


def _fit_logistic(X: Tensor, y: Tensor, n_classes: int, l2: float, max_iter: int, tol: float,
                  init: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    X = X.double()
    n, d = X.shape
    T = y.double()[:, None] if n_classes == 2 else one_hot(y, n_classes).double()
    Xa = torch.cat([X, X.new_ones(n, 1)], 1)
    Xa32 = Xa.float()
    pen = X.new_full((d + 1,), float(l2))
    pen[-1] = 0.0
    theta = X.new_zeros(T.shape[1], d + 1)
    if init is not None:
        theta = torch.cat([init[0].to(theta), init[1].to(theta)[:, None]], 1)

    def objective(th: Tensor) -> Tensor:
        z = Xa @ th.T
        return (softplus(z) - T * z).mean(0) + 0.5 * (pen * th.square()).sum(1)

    f = objective(theta)
    jitter = 1e-8 * torch.eye(d + 1, dtype=X.dtype, device=X.device)
    for _ in range(max_iter):
        p = torch.sigmoid(Xa @ theta.T)
        grad = (p - T).T @ Xa / n + pen * theta
        if float(grad.abs().max()) < tol:
            break
        weights = p * (1 - p) / n
        step = torch.stack([
            torch.cholesky_solve(g[:, None], _hessian_factor(Xa, Xa32, weights[:, r], pen, jitter))[:, 0]
            for r, g in enumerate(grad)
        ])
        t = torch.ones(len(theta), 1, dtype=X.dtype, device=X.device)
        decrease = (grad * step).sum(1)
        for _ in range(30):  # Armijo backtracking, per row
            f_new = objective(theta - t * step)
            bad = f_new > f - 1e-4 * t[:, 0] * decrease
            if not bad.any():
                break
            t[bad] /= 2
        theta = theta - t * step
        f = objective(theta)
    return theta[:, :d].contiguous(), theta[:, d].contiguous()


def _hessian_factor(Xa: Tensor, Xa32: Tensor, w: Tensor, pen: Tensor, jitter: Tensor) -> Tensor:
    """The Cholesky factor of one Newton step's Hessian ``Xaᵀ diag(w) Xa + diag(pen)``: its product taken in float32
    (half the cost; the float64 gradient still fixes the optimum exactly), or in float64 where float32's rounding
    leaves it not positive definite — states with a few very large coordinates, as Gemma 3's residual stream has
    (~2·10⁴: products of ~4·10⁸ whose rounding outweighs the penalty)."""
    L, info = torch.linalg.cholesky_ex((Xa32.T @ (w.float()[:, None] * Xa32)).double() + torch.diag(pen) + jitter)
    if int(info) == 0:
        return L
    return torch.linalg.cholesky(Xa.T @ (w[:, None] * Xa) + torch.diag(pen) + jitter)


def log_loss_and_accuracy(X: Tensor, y: Tensor, W: Tensor, b: Tensor) -> tuple[float, float]:
    """Mean log-loss and accuracy of the (one-vs-rest) logistic model on (X, y); k = 2 uses the single row."""
    z = X.double() @ W.T.double() + b.double()
    if W.shape[0] == 1:
        p1 = torch.sigmoid(z[:, 0])
        loss = torch.nn.functional.binary_cross_entropy(p1, y.double())
        pred = (z[:, 0] > 0).long()
    else:  # scikit-learn's OvR probabilities: normalised sigmoids
        p = torch.sigmoid(z)
        p = p / p.sum(1, keepdim=True)
        loss = -p.gather(1, y[:, None]).clamp_min(1e-15).log().mean()
        pred = z.argmax(1)
    return float(loss), float((pred == y).double().mean())
