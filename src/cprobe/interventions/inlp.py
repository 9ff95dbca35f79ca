"""Iterative Nullspace Projection (Ravfogel et al. 2020).

Repeatedly train a linear classifier for Z on the already-projected data, then project onto
the nullspace of every classifier found so far. ``rank`` counts removed directions: one per
iteration for binary Z, one per one-vs-rest row (k per iteration) for k > 2, as in the
original's LinearSVC loop; the last iteration keeps only its largest-norm rows so exactly
``rank`` directions go.
"""

from __future__ import annotations

import warnings
from typing import Self

import torch
from torch import Tensor

from cprobe.errors import ConfigError, DataError
from cprobe.interventions.base import INTERVENTIONS, Intervention


def n_classes_of(z: Tensor) -> int:
    """Number of classes implied by int labels in [0, k); at least two must occur."""
    if z.ndim != 1 or z.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise DataError(f"labels must be a 1-d integer tensor, got shape {tuple(z.shape)} dtype {z.dtype}")
    if z.numel() == 0 or int(z.min()) < 0:
        raise DataError("labels must be non-empty class ids in [0, k)")
    if z.unique().numel() < 2:
        raise DataError("labels contain a single class; an intervention needs at least two")
    return int(z.max()) + 1


def fit_linear_classifier(
    X: Tensor, y: Tensor, n_classes: int, l2: float = 1e-3, max_iter: int = 100
) -> tuple[Tensor, Tensor]:
    """L2-regularised logistic regression by full-batch L-BFGS: returns (W, b).

    Binary labels give one row (positive side = class 1); k > 2 gives k one-vs-rest rows,
    fitted jointly since their objectives are independent. Deterministic: zero init.
    """
    rows = 1 if n_classes == 2 else n_classes
    X = X.double()  # float64: late INLP iterations chase a tiny residual class signal
    target = y.double()[:, None] if n_classes == 2 else torch.nn.functional.one_hot(y, n_classes).double()
    W = torch.zeros(rows, X.shape[1], device=X.device, dtype=X.dtype, requires_grad=True)
    b = torch.zeros(rows, device=X.device, dtype=X.dtype, requires_grad=True)
    opt = torch.optim.LBFGS(
        [W, b], lr=1.0, max_iter=max_iter, tolerance_grad=1e-12, line_search_fn="strong_wolfe"
    )

    def closure() -> Tensor:
        opt.zero_grad()
        logits = torch.addmm(b, X, W.T)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(X)
        loss = loss + 0.5 * l2 * W.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return W.detach().float(), b.detach().float()


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

    def __init__(self, rank: int, l2: float = 1e-3, max_iter: int = 100, device: str | None = None) -> None:
        if not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"rank must be a non-negative integer, got {rank!r}")
        if l2 < 0:
            raise ConfigError(f"l2 must be >= 0, got {l2}")
        if max_iter < 1:
            raise ConfigError(f"max_iter must be >= 1, got {max_iter}")
        self.rank = rank
        self.l2 = l2
        self.max_iter = max_iter
        self.device = device

    def fit(self, X: Tensor, z: Tensor) -> Self:
        Xd, zd, k = prepare_rank_fit(X, z, self.rank, self.device)
        d, device = Xd.shape[1], Xd.device
        Q = Xd.new_zeros(d, 0)
        dirs: list[Tensor] = []
        biases: list[Tensor] = []
        classes: list[Tensor] = []
        row_class = torch.arange(k, device=device) if k > 2 else torch.ones(1, dtype=torch.long, device=device)
        while Q.shape[1] < self.rank:
            P = torch.eye(d, device=device) - Q @ Q.T
            W, b = fit_linear_classifier(Xd @ P, zd, k, self.l2, self.max_iter)
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
        self.directions = torch.cat(dirs) if dirs else Xd.new_zeros(0, d)
        self.biases = torch.cat(biases) if biases else Xd.new_zeros(0)
        self.row_classes = torch.cat(classes) if classes else torch.zeros(0, dtype=torch.long, device=device)
        self.P = torch.eye(d, device=device) - Q @ Q.T
        return self

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        P = self.P.to(X.device)
        return (X.to(P.dtype) @ P).to(X.dtype)
