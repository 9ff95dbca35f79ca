"""Iterative Nullspace Projection (Ravfogel et al. 2020).

Repeatedly train a linear classifier for Z on the already-projected data, then project onto
the nullspace of every classifier found so far. ``rank`` counts removed directions: one per
iteration for binary Z, one per one-vs-rest row (k per iteration) for k > 2, as in the
original's LinearSVC loop; the last iteration keeps only its largest-norm rows so exactly
``rank`` directions go.

The classifier is the reference's: scikit-learn's ``LogisticRegression()`` objective at its default C = 1
(penalty ½‖w‖² against the summed log-loss), solved to its optimum by Newton's method
(:mod:`cprobe.stats`). ``l2`` instead sets a per-sample penalty (mean log-loss +
l2/2 ‖w‖²; cprobe ≤ 0.3 used l2 = 1e-3, i.e. C ≈ 0.2 on 4.5k rows), which makes the regularisation
independent of the sample size.
"""

from __future__ import annotations

import warnings
from typing import Self

import torch
from torch import Tensor

from cprobe.errors import ConfigError, DataError
from cprobe.interventions.base import INTERVENTIONS, Intervention, n_classes_of
from cprobe.compute import fit_threads
from cprobe.stats import fit_logistic, l2_for_C, newton_flops


def _orthonormal_extension(Q: Tensor, V: Tensor, tol: float = 1e-4) -> tuple[Tensor, Tensor]:
    """Orthonormal basis for the new directions in V's unit columns (d, m) beyond span(Q).

    Returns (basis (d, m'), kept column mask); columns within ``tol`` of the span so far
    are dropped as linearly dependent.
    """
    for _ in range(2):  # twice is enough for Gram-Schmidt in floating point
        V = V - Q @ (Q.T @ V)
    kept = torch.zeros(V.shape[1], dtype=torch.bool, device=V.device)
    basis: list[Tensor] = []
    for j in range(V.shape[1]):
        v = V[:, j]
        for u in basis:
            v = v - (u @ v) * u
        norm = v.norm()
        if norm > tol:
            basis.append(v / norm)
            kept[j] = True
    if not basis:
        return V.new_zeros(V.shape[0], 0), kept
    return torch.stack(basis, 1), kept


def prepare_rank_fit(X: Tensor, z: Tensor, rank: int, device: str | None) -> tuple[Tensor, Tensor, int]:
    """Checks ``rank <= d`` and moves (X, z) to the fitting device: (X float32, z, number of classes)."""
    d = X.shape[1]
    if rank > d:
        raise ConfigError(f"rank {rank} exceeds the embedding size {d}; choose rank <= {d}")
    dev = torch.device(device) if device else X.device
    return X.to(device=dev, dtype=torch.float32), z.to(dev), n_classes_of(z)


@INTERVENTIONS.register("inlp")
class INLP(Intervention):
    """Nullifying: ``transform(X) = X P`` with P the projection onto the classifiers' nullspace.

    After ``fit``: ``P`` (d, d) symmetric idempotent of rank d − rank (fewer directions, with
    a warning, if Z stops being linearly predictable first); ``directions`` (rank, d)
    unit classifier normals (each orthogonal to all earlier iterations'); ``biases`` (rank,)
    matching offsets so ``directions @ h + biases`` is the signed distance to each hyperplane;
    ``row_classes`` (rank,) the class on each normal's positive side.
    """

    kind = "nullifying"
    exposes_direction = True

    def __init__(self, rank: int, C: float = 1.0, l2: float | None = None, max_iter: int = 100,
                 device: str | None = None) -> None:
        if not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"rank must be a non-negative integer, got {rank!r}")
        if not isinstance(C, int | float) or C <= 0:
            raise ConfigError(f"C must be a positive number, got {C!r}")
        if l2 is not None and (not isinstance(l2, int | float) or l2 < 0):
            raise ConfigError(f"l2 must be a number >= 0 (or null to use C), got {l2!r}")
        if max_iter < 1:
            raise ConfigError(f"max_iter must be >= 1, got {max_iter}")
        self.rank, self.C, self.l2, self.max_iter, self.device = rank, C, l2, max_iter, device

    def fit(self, X: Tensor, z: Tensor) -> Self:
        Xd, zd, k = prepare_rank_fit(X, z, self.rank, self.device)
        with fit_threads(newton_flops(*Xd.shape), Xd.device):  # its projections are as small as its Newton steps
            return self._fit(Xd, zd, k)

    def _fit(self, Xd: Tensor, zd: Tensor, k: int) -> Self:
        Xd = Xd.double()  # late iterations chase a small residual class signal
        (n, d), device = Xd.shape, Xd.device
        l2 = self.l2 if self.l2 is not None else l2_for_C(self.C, n)
        Q = Xd.new_zeros(d, 0)
        dirs: list[Tensor] = []
        biases: list[Tensor] = []
        classes: list[Tensor] = []
        row_class = torch.arange(k, device=device) if k > 2 else torch.ones(1, dtype=torch.long, device=device)
        while Q.shape[1] < self.rank:
            P = torch.eye(d, device=device, dtype=Xd.dtype) - Q @ Q.T
            W, b = fit_logistic(Xd @ P, zd, k, l2, self.max_iter)
            W = W @ P  # the part outside the current nullspace never touched the projected data
            norms = W.norm(dim=1)
            order = norms.argsort(descending=True)[: self.rank - Q.shape[1]]
            order = order[norms[order] > 1e-8]  # below that W is numerically zero
            new, kept = _orthonormal_extension(Q, (W[order] / norms[order, None]).T)
            if new.shape[1] == 0:
                # The projected class means coincide, so the (convex, regularised) classifier's
                # optimum is W = 0: nothing linear is left to remove and P keeps a larger rank.
                warnings.warn(
                    f"INLP stopped after {Q.shape[1]} of {self.rank} directions: Z is no longer "
                    "linearly predictable from the projected data",
                    stacklevel=2,
                )
                break
            order = order[kept]
            dirs.append(W[order] / norms[order, None])
            biases.append(b[order] / norms[order])
            classes.append(row_class[order])
            Q = torch.cat([Q, new], 1)
        self.n_classes = k
        # fitted in float64; kept in float32 like the activations they apply to
        self.directions = (torch.cat(dirs) if dirs else Xd.new_zeros(0, d)).float()
        self.biases = (torch.cat(biases) if biases else Xd.new_zeros(0)).float()
        self.row_classes = torch.cat(classes) if classes else torch.zeros(0, dtype=torch.long, device=device)
        self.P = (torch.eye(d, device=device, dtype=Xd.dtype) - Q @ Q.T).float()
        return self

    def edit_direction(self) -> Tensor | None:
        """The one classifier normal removed, when INLP removed exactly one (``rank: 1`` on a binary Z)."""
        self.check_fitted()
        return self.directions[0].clone() if self.directions.shape[0] == 1 else None

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        P = self.P.to(X.device)
        return (X.to(P.dtype) @ P).to(X.dtype)
